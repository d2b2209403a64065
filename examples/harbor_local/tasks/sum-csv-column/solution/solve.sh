#!/bin/bash
# Reference solution of sum-csv-column.
set -e
python3 -c "import csv; rows = csv.DictReader(open('/app/sales.csv')); print(f\"{sum(float(r['amount']) for r in rows if r['region'] == 'north'):.2f}\")" > /app/answer.txt
