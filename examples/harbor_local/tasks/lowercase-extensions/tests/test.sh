#!/bin/bash
# Verifier of lowercase-extensions: writes 1 or 0 to /logs/verifier/reward.txt (Harbor's verifier reads it).
mkdir -p /logs/verifier
if [ -z "$(ls /app/photos/*.JPG 2>/dev/null)" ] && [ "$(cat /app/photos/IMG_001.jpg /app/photos/IMG_002.jpg /app/photos/IMG_003.jpg /app/photos/IMG_004.jpg 2>/dev/null | tr '\n' ',')" = "photo 1,photo 2,photo 3,photo 4," ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
