#!/bin/bash
# Reference solution of lowercase-extensions.
set -e
cd /app/photos && for f in *.JPG; do mv "$f" "${f%.JPG}.jpg"; done
