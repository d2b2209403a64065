#!/bin/bash
set -e
python3 /solution/summarize.py /srv/data/access.log > /app/errors_by_path.txt
cat /app/errors_by_path.txt
