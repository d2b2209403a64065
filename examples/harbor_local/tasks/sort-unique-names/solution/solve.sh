#!/bin/bash
# Reference solution of sort-unique-names.
set -e
sort -u /app/names.txt > /app/unique.txt
