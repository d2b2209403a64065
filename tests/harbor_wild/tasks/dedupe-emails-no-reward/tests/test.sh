#!/bin/bash
mkdir -p /logs/verifier
cd /app
pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
