#!/bin/bash
source /tests/lib.sh
cd /app
: "${MIN_LENGTH:?set by [steps.verifier.env]}"
expect "still works without the option" "$(printf 'the 5\ndog 4')" python3 /app/wordfreq.py /app/data/corpus.txt 2
expect "--min-length $MIN_LENGTH after" "$(printf 'quick 3\nbarks 1')" \
  python3 /app/wordfreq.py /app/data/corpus.txt 2 --min-length "$MIN_LENGTH"
expect "--min-length $MIN_LENGTH before, on extra.txt" "$(printf 'boats 3\nfloat 3\nharbor 2')" \
  python3 /app/wordfreq.py --min-length "$MIN_LENGTH" /app/extra.txt 3
finish
