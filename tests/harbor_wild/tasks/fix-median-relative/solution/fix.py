# Patches stats.py in the current working directory (the container's WORKDIR).
from pathlib import Path

src = Path("stats.py")
text = src.read_text()
old = """def median(values):
    values.sort()
    n = len(values)
    return values[n // 2]
"""
new = """def median(values):
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
"""
assert old in text, "unexpected stats.py"
src.write_text(text.replace(old, new))
print("patched", src.resolve())
