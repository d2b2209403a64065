#!/bin/bash
# Reference solution of fix-mean-bug.
set -e
sed -i 's/for v in values\[1:\]:/for v in values:/' /app/stats.py
