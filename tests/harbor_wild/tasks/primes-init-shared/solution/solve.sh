#!/bin/bash

# Use this file to solve the task.
seq 2 100 | factor | awk 'NF == 2 { print $2 }' | head -n 20 > /app/primes.txt
