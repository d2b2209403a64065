#!/bin/bash
set -e
cp /solution/slugify.py /app/slugify.py
