"""Multi-step Harbor tasks for tests, made with Harbor's own `harbor tasks init --steps N` (the real CLI) and then
filled in the way an author fills them in: each step's instruction, solution and tests.

The task built here keeps a counter file: step k appends the line `step k` to `/app/progress.txt`, and step k's
tests check that the file holds exactly the lines `step 1` .. `step k` (so a step that was skipped or done twice
fails). Its tests source a shared helper from the task's top-level `tests/` (merged with each step's own tests).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HARBOR_CLI = Path(sys.executable).with_name("harbor")
#: The base image the stand-in Docker setup has (registries are unreachable here).
BASE_IMAGE = "python:3.12-slim"

SHARED_HELPER = """\
# Shared by every step's test.sh: write the reward for whether /app/progress.txt holds step 1..$1.
check_progress() {
  expected=$(seq 1 "$1" | sed 's/^/step /')
  if [ "$(cat /app/progress.txt 2>/dev/null)" = "$expected" ]; then
    echo 1 > /logs/verifier/reward.txt
  else
    echo 0 > /logs/verifier/reward.txt
  fi
}
"""

STEP_TEST = """#!/bin/bash
source /tests/helpers.sh
check_progress {k}
"""


def harbor_init(root: Path, name: str, *args: str) -> Path:
    """Run `harbor tasks init org/NAME ARGS -p ROOT` (the real CLI) and return the task dir."""
    subprocess.run([str(HARBOR_CLI), "tasks", "init", f"acme/{name}", "-p", str(root), *args],
                   check=True, capture_output=True, text=True, timeout=120)
    return root / name


def make_counter_task(root: Path, name: str = "counter", steps: int = 3, *, min_reward: dict[int, float] | None = None,
                      broken_step: int | None = None, strategy: str | None = None) -> Path:
    """A `steps`-step task made by `harbor tasks init --steps N --verifier-mode shared --no-pytest`, filled in.

    Args:
        min_reward: `min_reward` per step number (1-based), written into that step's `[[steps]]` table.
        broken_step: A step whose reference solution appends a wrong line (its tests then fail).
        strategy: `multi_step_reward_strategy` to write (`mean`, `final`); None leaves Harbor's default.
    """
    task = harbor_init(root, name, "--steps", str(steps), "--verifier-mode", "shared", "--no-pytest")
    _from_base_image(task / "environment" / "Dockerfile")
    (task / "tests").mkdir(exist_ok=True)
    (task / "tests" / "helpers.sh").write_text(SHARED_HELPER)
    for k in range(1, steps + 1):
        step = task / "steps" / f"step-{k}"
        (step / "instruction.md").write_text(f"Append the line `step {k}` to `/app/progress.txt` (create the file "
                                             "if it does not exist), keeping what it already holds.\n")
        line = f"step {k}" if k != broken_step else "not this"
        (step / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho '{line}' >> /app/progress.txt\n")
        (step / "tests" / "test.sh").write_text(STEP_TEST.format(k=k))
    toml = (task / "task.toml").read_text()
    if strategy is not None:
        toml = toml.replace('schema_version = "1.4"\n', f'schema_version = "1.4"\nmulti_step_reward_strategy = '
                                                        f'"{strategy}"\n', 1)
    for k, threshold in (min_reward or {}).items():
        toml = toml.replace(f'name = "step-{k}"\n', f'name = "step-{k}"\nmin_reward = {threshold}\n', 1)
    (task / "task.toml").write_text(toml)
    return task


SEPARATE_TEST = """#!/bin/bash
# Runs in the verifier's own container: the agent's /app/answer.txt arrives as a declared artifact.
echo "verifier image: $(cat /etc/verifier-image 2>/dev/null || echo none)"
if [ "$(cat /app/answer.txt 2>/dev/null)" = "{answer}" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
VERIFIER_DOCKERFILE = f"FROM {BASE_IMAGE}\n\nRUN echo separate > /etc/verifier-image\nWORKDIR /app\n\nCOPY . /tests/\n"


def _from_base_image(dockerfile: Path) -> None:
    dockerfile.write_text(re.sub(r"(?m)^FROM .*$", f"FROM {BASE_IMAGE}", dockerfile.read_text()))


def make_separate_task(root: Path, name: str = "separate", steps: int = 0) -> Path:
    """A task made by `harbor tasks init` with its default separate verifier environment (`--steps N` when `steps`),
    filled in: the solution (of step k) writes `/app/answer.txt`, declared as an artifact (of the task; for steps,
    of each step), and the verifier's own image (`tests/Dockerfile`, the step's for steps) checks it."""
    args = ["--no-pytest"] + (["--steps", str(steps)] if steps else [])
    task = harbor_init(root, name, *args)
    _from_base_image(task / "environment" / "Dockerfile")
    toml = (task / "task.toml").read_text()
    if not steps:
        (task / "instruction.md").write_text("Write the word `ready` to `/app/answer.txt`.\n")
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho ready > /app/answer.txt\n")
        (task / "tests" / "test.sh").write_text(SEPARATE_TEST.format(answer="ready"))
        (task / "tests" / "Dockerfile").write_text(VERIFIER_DOCKERFILE)
        toml = toml.replace("artifacts = []\n", 'artifacts = ["/app/answer.txt"]\n', 1)
    else:
        for k in range(1, steps + 1):
            step = task / "steps" / f"step-{k}"
            (step / "instruction.md").write_text(f"Write `answer {k}` to `/app/answer.txt` (replacing what it holds).\n")
            (step / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho 'answer {k}' > /app/answer.txt\n")
            (step / "tests" / "test.sh").write_text(SEPARATE_TEST.format(answer=f"answer {k}"))
            (step / "tests" / "Dockerfile").write_text(VERIFIER_DOCKERFILE)
            toml = toml.replace(f'name = "step-{k}"\nartifacts = []\n',
                                f'name = "step-{k}"\nartifacts = ["/app/answer.txt"]\n', 1)
    (task / "task.toml").write_text(toml)
    return task
