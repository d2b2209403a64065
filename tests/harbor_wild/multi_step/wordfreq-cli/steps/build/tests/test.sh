#!/bin/bash
source /tests/lib.sh
cd /app
expect "top 3 of the corpus" "$(printf 'the 5\ndog 4\nfox 3')" python3 /app/wordfreq.py /app/data/corpus.txt 3
expect "top 1 of a fresh file" "cat 2" bash -c "printf 'Cat cat dog\n' > /tmp/one.txt && python3 /app/wordfreq.py /tmp/one.txt 1"
finish
