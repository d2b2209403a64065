#!/bin/bash
# Partial credit: verify.py writes a fraction of the checks passed to reward.txt itself.
mkdir -p /logs/verifier
python3 /tests/verify.py
