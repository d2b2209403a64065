"""Helpers for the sandbox tests: tiny Harbor task folders, environments built through Harbor's own factory, and
leak checks that ask the operating system (/proc), not raygrpo's bookkeeping."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from harbor.environments.base import BaseEnvironment
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig
from harbor.models.trial.paths import TrialPaths

LOCAL = "raygrpo.sandbox.local:LocalSandboxEnvironment"
NULL = "raygrpo.testing.null:NullEnvironment"

DEFAULT_DOCKERFILE = """\
FROM python:3.12-slim
WORKDIR /app
COPY data.txt ./
RUN pip install --no-cache-dir numpy
"""

DEFAULT_TEST_SH = """\
#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def make_task(
    root: Path,
    name: str = "task",
    *,
    dockerfile: str = DEFAULT_DOCKERFILE,
    files: dict[str, str] | None = None,
    test_sh: str = DEFAULT_TEST_SH,
    task_toml_env: str = "",
) -> Path:
    """A Harbor task folder: instruction.md, task.toml, environment/Dockerfile (+ files), tests/test.sh."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (task / "task.toml").write_text(
        textwrap.dedent(
            """\
            version = "1.0"
            [verifier]
            timeout_sec = 60
            [agent]
            timeout_sec = 60
            [environment]
            """
        )
        + task_toml_env
    )
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, content in {"data.txt": "payload\n", **(files or {})}.items():
        path = task / "environment" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    (task / "tests" / "test.sh").write_text(test_sh)
    return task


def make_env(
    task_dir: Path,
    trial_root: Path,
    sandbox_root: Path,
    *,
    import_path: str = LOCAL,
    kwargs: dict | None = None,
    **factory_kwargs,
) -> tuple[BaseEnvironment, Task, TrialPaths]:
    """An environment for `task_dir`, created the way raygrpo's Harbor adapter does: through Harbor's factory."""
    task = Task(task_dir)
    paths = TrialPaths(trial_root / uuid.uuid4().hex[:8])
    paths.mkdir()
    extra = {"sandbox_root": str(sandbox_root)} if import_path == LOCAL else {}
    env = EnvironmentFactory.create_environment_from_config(
        TrialEnvironmentConfig(import_path=import_path, kwargs={**extra, **(kwargs or {})}),
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id=f"{task.short_name}__{uuid.uuid4().hex[:6]}",
        trial_paths=paths,
        task_env_config=task.config.environment,
        **factory_kwargs,
    )
    return env, task, paths


# ---------------------------------------------------------------------------------------------- OS-level checks


def pid_namespace(pid: int) -> str:
    """The PID namespace of a process, e.g. 'pid:[4026532180]'."""
    return os.readlink(f"/proc/{pid}/ns/pid")


def pids_in_namespace(ns: str) -> list[int]:
    """Every live (non-zombie) process in the given PID namespace, found by scanning /proc."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") != ns:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z":
            out.append(int(entry.name))
    return out


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment mentions `text` (e.g. a sandbox root)."""
    needle = text.encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            data = Path(f"/proc/{entry.name}/cmdline").read_bytes() + Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        if needle in data:
            out.append(int(entry.name))
    return out


def mounts_mentioning(text: str) -> list[str]:
    """mountinfo lines, of this process and of every other, that mention `text`."""
    lines = [f"self: {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if text in line]
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                content = Path(f"/proc/{entry.name}/mountinfo").read_text()
            except OSError:
                continue
            lines += [f"{entry.name}: {line}" for line in content.splitlines() if text in line]
    return lines


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def assert_no_leaks(sandbox_root: Path, timeout: float = 5.0) -> None:
    """No process mentions the sandbox root and no mount table holds anything from it."""
    root = str(sandbox_root)
    assert wait_until(lambda: not processes_mentioning(root), timeout), processes_mentioning(root)
    assert not mounts_mentioning(root), mounts_mentioning(root)


# ---------------------------------------------------------------------------------------------- owner processes

#: The repository root.
REPO = str(Path(__file__).resolve().parent.parent)

OWNER_SCRIPT = """
import asyncio, json
from tests.sandbox_utils import make_env
from pathlib import Path

async def main():
    envs = []
    for i in range({count}):
        env, _, _ = make_env(Path({task!r}), Path({trials!r}), Path({root!r}), kwargs={{"owner_id": "owner-{count}"}})
        await env.start(force_build=False)
        await env.exec("sleep 1000 & setsid sleep 1001 &")
        envs.append(env)
    print(json.dumps([{{"id": e.sandbox_id, "init": e.init_pid, "dir": str(e.host_dir)}} for e in envs]), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def spawn_owner(task: Path, trials: Path, root: Path, count: int = 1) -> tuple[subprocess.Popen, list[dict]]:
    """A separate Python process that starts `count` sandboxes (each with background sleeps) and then waits.

    Returns the process and what it started (sandbox id, init pid, host dir).
    """
    import json

    script = OWNER_SCRIPT.format(
        task=str(task),
        trials=str(trials),
        root=str(root),
        count=count,
    )
    proc = subprocess.Popen(  # from the repository root, which `python -c` puts on sys.path (for `tests.`)
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        raise RuntimeError(f"owner process failed: {proc.stderr.read()}")
    return proc, json.loads(line)
