#!/bin/bash
cat > /app/solver.py <<'PY'
import sys

intervals = sorted(tuple(map(int, line.split())) for line in sys.stdin if line.strip())
merged = []
for start, end in intervals:
    if merged and start <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], end)
    else:
        merged.append([start, end])
for start, end in merged:
    print(start, end)
PY
chmod 755 /app/solver.py
