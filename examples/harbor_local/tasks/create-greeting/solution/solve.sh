#!/bin/bash
# Reference solution of create-greeting.
set -e
echo 'Hello, Harbor!' > /app/greeting.txt
