#!/bin/bash
set -euo pipefail

python3 - <<'PY'
import csv
import json
from collections import defaultdict

totals = defaultdict(float)
with open("/app/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] += int(row["units"]) * float(row["unit_price"])

with open("/app/revenue.json", "w") as f:
    json.dump({k: round(v, 2) for k, v in sorted(totals.items())}, f, indent=2)
PY
