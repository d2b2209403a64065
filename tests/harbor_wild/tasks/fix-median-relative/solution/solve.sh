#!/bin/bash
# Run from the task's working directory; the patch script sits next to this file.
set -e
python3 "$(dirname "$0")/fix.py"
python3 -c "import stats; print(stats.median([4, 1, 3, 2]))"
