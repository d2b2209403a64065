#!/bin/bash
# Ordinary shell that a token-level reading misreads: `2>&1` (a command `1`), `[ ! -f ... ]` (a command `-f`) and a
# multi-line python3 -c body (commands `import` and `json.dump`).
mkdir -p /logs/verifier
if [ ! -f /app/out.json ]; then
  echo "no /app/out.json" 2>&1
  echo 0 > /logs/verifier/reward.txt
  exit 0
fi
python3 -c "
import json
data = json.load(open('/app/out.json'))
ok = data.get('total') == 6
json.dump({'ok': ok}, open('/tmp/verdict.json', 'w'))
" 2>&1 | tee /logs/verifier/check.log
if grep -q true /tmp/verdict.json; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
