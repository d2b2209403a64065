#!/bin/bash
a=0; b=1; out=()
for _ in $(seq 15); do out+=("$a"); t=$((a + b)); a=$b; b=$t; done
(IFS=,; echo "${out[*]}") > /app/fib.txt
