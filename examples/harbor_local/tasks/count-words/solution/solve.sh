#!/bin/bash
# Reference solution of count-words.
set -e
wc -w < /app/poem.txt | tr -d ' ' > /app/answer.txt
