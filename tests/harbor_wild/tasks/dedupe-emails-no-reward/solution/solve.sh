#!/bin/bash
set -e
sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' /app/contacts.txt | tr '[:upper:]' '[:lower:]' | grep -v '^$' | sort -u > /app/unique.txt
