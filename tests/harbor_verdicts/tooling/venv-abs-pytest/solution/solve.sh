#!/usr/bin/env bash
set -euo pipefail
tail -n +2 /app/scores.csv | sort -t, -k2 -n -r | head -1 | cut -d, -f1 > /app/top.txt
