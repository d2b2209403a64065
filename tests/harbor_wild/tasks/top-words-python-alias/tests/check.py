import os
import sys

EXPECTED = ["the,8", "is,6", "quick,5", "dog,4", "fox,3"]

path = "/app/top_words.txt"
if not os.path.exists(path):
    print("FAIL: top_words.txt not found")
    sys.exit(1)
got = [line.strip() for line in open(path) if line.strip()]
if got != EXPECTED:
    print(f"FAIL: expected {EXPECTED}, got {got}")
    sys.exit(1)
print("PASS")
