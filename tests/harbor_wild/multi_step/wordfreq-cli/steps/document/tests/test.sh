#!/bin/bash
source /tests/lib.sh
cd /app
doc=/app/docs/USAGE.md
expect "title" "# wordfreq" head -n 1 "$doc"
expect "usage section" "1" grep -c '^## Usage' "$doc"
expect "command line" "1" grep -c 'wordfreq.py FILE N \[--min-length L\]' "$doc"
# The example's output must be the script's real output.
expect "real example output" "$(python3 /app/wordfreq.py /app/data/corpus.txt 3)" \
  bash -c "sed -n '/^\`\`\`/,/^\`\`\`/p' $doc | sed '1d;\$d'"
finish
