#!/bin/bash
python - <<'PY'
import re
from collections import Counter

words = re.findall(r"[a-z']+", open("/app/essay.txt").read().lower())
top = sorted(Counter(words).items(), key=lambda kv: (-kv[1], kv[0]))[:5]
with open("/app/top_words.txt", "w") as f:
    for w, n in top:
        f.write(f"{w},{n}\n")
PY
