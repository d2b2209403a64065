#!/bin/bash
cat > /app/wordfreq.py <<'PY'
import argparse
import re
from collections import Counter


def main():
    parser = argparse.ArgumentParser(description="Print the most frequent words of a file.")
    parser.add_argument("file")
    parser.add_argument("n", type=int)
    parser.add_argument("--min-length", type=int, default=0)
    args = parser.parse_args()
    with open(args.file) as f:
        words = [w for w in re.findall(r"[a-z]+", f.read().lower()) if len(w) >= args.min_length]
    for word, count in sorted(Counter(words).items(), key=lambda kv: (-kv[1], kv[0]))[: args.n]:
        print(word, count)


if __name__ == "__main__":
    main()
PY
