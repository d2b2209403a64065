import os
import tarfile

REWARD = "/logs/verifier/reward.txt"
ARCHIVE = "/app/backup.tar.gz"
MUST_HAVE = {"project/src/main.c", "project/Makefile", "project/docs/README.md"}
MUST_NOT = {"project/build.log", "project/src/debug.log", "project/tmp/scratch.txt"}

checks = []
names = set()
try:
    with tarfile.open(ARCHIVE, "r:gz") as tar:
        names = {m.name.lstrip("./") for m in tar.getmembers() if m.isfile()}
    checks.append(("archive opens as tar.gz", True))
except Exception as exc:  # missing or not a gzip tar
    checks.append((f"archive opens as tar.gz ({exc})", False))

checks.append(("required files present", MUST_HAVE <= names))
checks.append(("logs and tmp/ excluded", bool(names) and not (MUST_NOT & names)))
checks.append(("source tree intact", all(os.path.exists("/app/" + n) for n in MUST_HAVE | MUST_NOT)))

for label, ok in checks:
    print(("PASS " if ok else "FAIL ") + label)

# The intact-tree check only counts once an archive exists, so doing nothing scores 0.
score = sum(ok for _, ok in checks[:3]) / 3 if checks[3][1] else 0.0
with open(REWARD, "w") as f:
    f.write(f"{score:.4f}\n")
print("reward", score)
