#!/bin/bash
# Reference solution of fix-json-config.
set -e
cat > /app/settings.json <<'EOF'
{
  "name": "harbor-demo",
  "port": 8080,
  "debug": false,
  "tags": ["a", "b"]
}
EOF
