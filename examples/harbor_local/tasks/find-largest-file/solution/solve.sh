#!/bin/bash
# Reference solution of find-largest-file.
set -e
cd /app/data && find . -type f -printf '%s %P\n' | sort -n | tail -1 | cut -d' ' -f2 > /app/answer.txt
