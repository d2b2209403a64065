"""Helpers for Harbor tests: task dirs written on the fly, the example suite, an episode driver, and a recording
backend that stands in for Harbor backends this machine cannot run (docker, e2b).

The recording backend is test scaffolding at the factory boundary: Harbor's own `EnvironmentFactory` builds it with
exactly the arguments it would give the real backend class, so the tests see what docker or e2b would receive.
"""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path
from typing import Any, ClassVar

from harbor.environments.base import BaseEnvironment, ExecResult

from raygrpo.policy.base import GenerationContext
from raygrpo.agent.toolcalls import format_tool_call

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_DIR = REPO / "examples" / "harbor_local"
EXAMPLE_TASKS = EXAMPLE_DIR / "tasks"

GOOD_TEST = """#!/bin/bash
if [ "$(cat /app/out.txt 2>/dev/null)" = "ok" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

TASK_TOML = """schema_version = "1.4"

[task]
name = "tests/{name}"

[metadata]
difficulty = "easy"
{metadata}

[verifier]
timeout_sec = {verifier_timeout}

[environment]
build_timeout_sec = 600.0
{environment}
"""


def _write(path: Path, text: str, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_task(
    root: Path | str,
    name: str = "t",
    *,
    instruction: str = "Write ok to /app/out.txt.",
    test_sh: str | None = GOOD_TEST,
    solve_sh: str = "echo ok > /app/out.txt",
    files: dict[str, str] | None = None,
    metadata: str = "",
    environment: str = "",
    verifier_timeout: float = 60.0,
    toml: str | None = None,
    dockerfile: str | None = None,
) -> Path:
    """Write a small Harbor task dir `root/name` and return its path.

    `test_sh=None` leaves `tests/test.sh` out; `toml` replaces the whole task.toml; `files` go into `environment/`
    and are `COPY`'d to `/app` by the Dockerfile.
    """
    task = Path(root) / name
    _write(task / "instruction.md", instruction + "\n")
    _write(task / "task.toml", toml if toml is not None else TASK_TOML.format(
        name=name, metadata=metadata, verifier_timeout=verifier_timeout, environment=environment))
    lines = ["FROM python:3.12-slim", "WORKDIR /app"]
    for rel, content in (files or {}).items():
        _write(task / "environment" / rel, content)
        lines.append(f"COPY {rel} /app/{rel}")
    _write(task / "environment" / "Dockerfile", dockerfile if dockerfile is not None else "\n".join(lines) + "\n")
    if test_sh is not None:
        _write(task / "tests" / "test.sh", textwrap.dedent(test_sh), executable=True)
    _write(task / "solution" / "solve.sh", "#!/bin/bash\n" + solve_sh + "\n", executable=True)
    return task


def example_task_names() -> list[str]:
    return sorted(p.name for p in EXAMPLE_TASKS.iterdir() if p.is_dir())


def bash_script(*commands: str):
    """A scripted policy that runs `commands` through the bash tool, one per turn, then stops."""

    def script(ctx: GenerationContext) -> str:
        done = sum(1 for m in ctx.messages if m.get("role") == "tool")
        if done < len(commands):
            return format_tool_call("bash", {"command": commands[done]})
        return "Done."

    return script


def tool_texts(traj: Any) -> list[str]:
    return [m["content"] for m in traj.messages if m.get("role") == "tool"]


class RecordingMixin:
    """Records what Harbor's factory and the adapter give a backend, and runs nothing (put it before the backend
    class: `class DockerRecorder(RecordingMixin, DockerEnvironment)` keeps Docker's real constructor and checks).

    `exec` answers success with empty output; `download_dir` of `/logs/verifier` writes `reward_text` (when set) as
    `reward.txt` into the host folder, as a real backend's download would after `test.sh` ran.
    """

    #: Every instance made (tests clear it).
    instances: ClassVar[list[Any]] = []
    reward_text: ClassVar[str | None] = "1"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.init_kwargs = dict(kwargs)
        self.calls: list[tuple[str, Any]] = []
        super().__init__(*args, **kwargs)
        RecordingMixin.instances.append(self)

    async def start(self, force_build: bool) -> None:
        self.calls.append(("start", force_build))

    async def stop(self, delete: bool) -> None:
        self.calls.append(("stop", delete))

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        self.calls.append(("exec", {"command": command, "timeout_sec": timeout_sec,
                                    "user": self._resolve_user(user), "env": env}))
        return ExecResult(stdout="", stderr="", return_code=0)

    async def upload_file(self, source_path: Any, target_path: str) -> None:
        self.calls.append(("upload_file", (str(source_path), target_path)))

    async def upload_dir(self, source_dir: Any, target_dir: str) -> None:
        self.calls.append(("upload_dir", (str(source_dir), target_dir)))

    async def download_file(self, source_path: str, target_path: Any) -> None:
        self.calls.append(("download_file", (source_path, str(target_path))))

    async def download_dir(self, source_dir: str, target_dir: Any) -> None:
        self.calls.append(("download_dir", (source_dir, str(target_dir))))
        if source_dir.rstrip("/") == "/logs/verifier" and self.reward_text is not None:
            os.makedirs(target_dir, exist_ok=True)
            Path(target_dir, "reward.txt").write_text(self.reward_text)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def recording_backend(type_name: str) -> type:
    """A recording stand-in for a backend class this machine cannot load (e.g. e2b without its SDK)."""

    class RecordingEnvironment(RecordingMixin, BaseEnvironment):
        @staticmethod
        def type() -> str:
            return type_name

        def _validate_definition(self) -> None:
            pass

    RecordingEnvironment.__name__ = RecordingEnvironment.__qualname__ = f"Recording_{type_name}"
    return RecordingEnvironment
