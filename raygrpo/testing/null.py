"""A Harbor `BaseEnvironment` that does no work: the backend of scale tests and benchmarks.

Wrapped in `raygrpo.envs.harbor.faults.FaultInjectingEnvironment` with a start latency, it stands in for a provider
whose sandboxes only take time to create, so thousands of concurrent rollouts measure the orchestration itself.
It holds no thread, process, file or socket per sandbox: `start`, `stop` and `exec` return at once with success,
uploads are no-ops, downloads create empty files (or, with `reward`, a verifier reward file).

Load it with `import_path="raygrpo.testing.null:NullEnvironment"`.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.trial.paths import EnvironmentPaths

#: How a config names this backend (`import_path:`).
NULL_IMPORT_PATH = "raygrpo.testing.null:NullEnvironment"

#: Every live NullEnvironment (started, not stopped), counted for leak checks; a counter, not a registry.
_live = 0


def live_null_environments() -> int:
    """How many NullEnvironments of this process are started and not yet stopped."""
    return _live


class NullEnvironment(BaseEnvironment):
    """A backend that does nothing, instantly (for scale tests; pair it with `FaultConfig` latencies).

    Args:
        environment_dir, environment_name, session_id, trial_paths, task_env_config, logger:
            as for every Harbor `BaseEnvironment` (passed by Harbor's factory). No environment definition is needed.
        exec_stdout (`str`, defaults to `""`):
            what every exec prints (stdout; stderr is always empty and the return code 0).
        reward (`float`, *optional*):
            when set, downloading the verifier directory (`/logs/verifier`) writes `reward.txt` with this value, so
            Harbor's verifier scores every rollout; when None it finds no reward file.
        **kwargs: the remaining `BaseEnvironment` arguments.
    """

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: Any,
        task_env_config: Any,
        logger: Any = None,
        *,
        exec_stdout: str = "",
        reward: float | None = None,
        **kwargs: Any,
    ):
        self._exec_stdout = exec_stdout or None
        self._reward = reward
        self._running = False
        super().__init__(
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            logger=logger,
            **kwargs,
        )

    @staticmethod
    def type() -> str:
        return "raygrpo-null"

    def _validate_definition(self) -> None:
        pass

    async def start(self, force_build: bool) -> None:
        global _live
        if not self._running:
            self._running = True
            _live += 1

    async def stop(self, delete: bool = True) -> None:
        global _live
        if self._running:
            self._running = False
            _live -= 1

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        return ExecResult(stdout=self._exec_stdout, stderr=None, return_code=0)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        return None

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        return None

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        if self._reward is not None and PurePosixPath(source_dir) == EnvironmentPaths.verifier_dir:
            (target / "reward.txt").write_text(f"{self._reward}\n")
