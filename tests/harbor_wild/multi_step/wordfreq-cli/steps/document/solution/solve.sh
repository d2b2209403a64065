#!/bin/bash
cd /app
{
  echo "# wordfreq"
  echo
  echo "## Usage"
  echo
  echo '    python3 wordfreq.py FILE N [--min-length L]'
  echo
  echo 'Example: `python3 wordfreq.py data/corpus.txt 3`'
  echo
  echo '```'
  python3 wordfreq.py data/corpus.txt 3
  echo '```'
} > /app/docs/USAGE.md
