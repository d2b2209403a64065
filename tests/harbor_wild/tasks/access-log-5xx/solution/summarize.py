"""Reference solution: count 5xx responses per request path."""
import re
import sys
from collections import Counter

LINE = re.compile(r'"(?P<method>\S+) (?P<path>\S+) [^"]*" (?P<status>\d{3}) ')

counts = Counter()
with open(sys.argv[1]) as f:
    for line in f:
        m = LINE.search(line)
        if m and m.group("status").startswith("5"):
            counts[m.group("path")] += 1

for path, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"{n} {path}")
