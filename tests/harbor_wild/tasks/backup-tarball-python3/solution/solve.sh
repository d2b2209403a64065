#!/bin/bash
set -euo pipefail
cd /app
tar --exclude='*.log' --exclude='project/tmp' -czf backup.tar.gz project
tar -tzf backup.tar.gz
