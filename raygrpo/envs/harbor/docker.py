"""What raygrpo adds to Harbor's docker backend (`environment_type: docker`), for one suite on one env pool actor.

- **Labels and an init.** Each sandbox gets an extra compose file (Harbor's `extra_docker_compose`, after any the
  spec's `environment_kwargs` name) that runs its main service under an init and labels it with the run and its
  owner (`raygrpo.docker.owners`): stops take a fraction of a second instead of Docker's 10 s timeout, and
  reapers and leak counts find the sandbox through docker itself.
- **One image per task, reused.** Harbor 0.25 computes a content-addressed image name (`hb__` + the environment
  folder's hash) but its compose file does not use it, so compose tags every sandbox's image `<session>-main`: one
  more tag per rollout, never removed, since raygrpo stops docker sandboxes without deleting images
  (`HarborSpec.stop_delete`). The compose file names the image `hb__<hash>` instead, and once that image exists on
  the node, later sandboxes of the task start from it as a prebuilt image: no `docker compose build` per rollout.
  Tasks that name their own image are left to Harbor. One sandbox per node builds
  a missing image (an asyncio lock per actor, a file lock per node for the actors beside it); the others wait for
  it and start from what it built: concurrent builds of one image cost the CPU once per sandbox and leave every
  image but the last tagged one dangling.
- **Compose sidecars leave nothing.** A task's own compose services, volumes and networks are labelled like the
  sandbox, the images of the services it builds get one name per task and service, and its volumes are removed
  once the sandbox stops (`raygrpo.docker.sidecars`): nothing of a rollout stays in docker, and the run's leak count
  sees whatever would.
- **Broken images are the task's.** A start whose `docker compose build` failed at a Dockerfile step (a `RUN` that
  needs a network the build cannot reach, a base image that cannot be pulled), or whose `up` could not pull an image
  the task names (a compose sidecar's), is a `TaskError` naming the step or the image with the daemon's own line
  (`raygrpo.envs.harbor.compose_failures`): `task_error`, not retried. A failure before any step ran (no daemon, no
  compose) stays an infrastructure error, its cause the daemon's line, whole.
  Docker's classic builder keeps the container of a failed `RUN` step: it is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.envs.harbor.compose_failures import explain as explain_compose
from raygrpo.envs.harbor.compose_failures import compose_failure, pull_failure
from raygrpo.envs.harbor.network import static_mode
from raygrpo.core.errors import TaskError
from raygrpo.core.scratch import shared_tempdir
from raygrpo.docker import guard as docker_guard
from raygrpo.docker.engine import DockerObject, DockerUnavailable, find, image_exists, remove
from raygrpo.docker.owners import owner_labels, write_overlay
from raygrpo.docker.sidecars import SESSION_LABEL, declares_volumes, read_compose, sidecar_overlay
from raygrpo.envs.harbor.tasks import COMPOSE_FILE

if TYPE_CHECKING:
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.task.task import Task

logger = logging.getLogger(__name__)

OVERLAY_NAME = "raygrpo-docker-compose.json"
#: The folder of the per-node build locks (one file per image; the Docker engine is the node's own), in the temp dir
#: the node's processes share (`raygrpo.core.scratch.shared_tempdir`: an env pool actor's own temp dir is private).
BUILD_LOCK_DIR_NAME = "raygrpo-docker-builds"
#: How often a start waiting for another process's build of its image looks again.
_LOCK_POLL_S = 0.1
#: A step as the classic builder (`Step 2/4 : RUN ...`) and BuildKit (` > [2/4] RUN ...:`) print the failed one.
_STEP = re.compile(r"^(?:Step (?P<n>\d+/\d+) : (?P<instruction>.*)|\s*> \[(?:\S+ )?(?P<bk_n>\d+/\d+)\] (?P<bk_instruction>.*):)$",
                   re.MULTILINE)
_EXIT = re.compile(r"(?:returned a non-zero code|did not complete successfully: exit code): (?P<code>\d+)")
_RUNNING_IN = re.compile(r"^\s*---> Running in (?P<id>[0-9a-f]{12,64})\s*$", re.MULTILINE)
#: Lines of the builders and of compose that say nothing about why a step failed.
_NOISE = re.compile(r"^(---> |Removing intermediate container|time=\"|Image \S+ Build|Sending build context|#\d+ )")
_RULE = re.compile(r"^-{4,}$")
_TIMESTAMP = re.compile(r"^\d+\.\d+ ")


@dataclass(frozen=True)
class BuildFailure:
    """A Dockerfile step that failed in `docker compose build`.

    Args:
        step: `n/m` as the builder numbers it.
        instruction: The step's instruction (cut to 200 characters).
        exit_code: The step's exit code, when it ran and exited.
        detail: The step's last line of output that says why, when there is one.
        container: The classic builder's container of the failed `RUN` step, which it does not remove.
    """

    step: str
    instruction: str
    exit_code: int | None
    detail: str | None
    container: str | None

    def __str__(self) -> str:
        what = f"exited with code {self.exit_code}" if self.exit_code is not None else "failed"
        return f"step {self.step} `{self.instruction}` {what}" + (f": {self.detail}" if self.detail else "")


def build_failure(message: str) -> BuildFailure | None:
    """Which Dockerfile step failed and why, from Harbor's error for a failed `docker compose build`; None when the
    error is not a build failure or no step ran (the engine or compose failed: infrastructure)."""
    failure = compose_failure(message)
    if failure is None or failure.command != "build":
        return None
    out = failure.output
    steps = list(_STEP.finditer(out))
    if not steps:
        return None
    step = steps[-1]
    instruction = (step["instruction"] or step["bk_instruction"]).strip()
    if len(instruction) > 200:
        instruction = instruction[:197] + "..."
    after = out[step.end():]
    exited = _EXIT.search(after)
    detail = None
    for line in after.splitlines():
        line = line.strip()
        if _RULE.match(line):
            break  # BuildKit: the step's output ends here, its Dockerfile excerpt follows
        if line and not _NOISE.match(line) and not _EXIT.search(line):
            detail = _TIMESTAMP.sub("", line)  # whole: a cut line ends inside a path
    container = next((m["id"] for m in _RUNNING_IN.finditer(after)), None)
    code = int(exited["code"]) if exited is not None else None
    return BuildFailure(step["n"] or step["bk_n"], instruction, code, detail, container)


class DockerSupport:
    """raygrpo's additions to Harbor's docker backend for one suite on one env pool actor (see the module docstring).

    Args:
        label: How errors name the suite.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self._image_names: dict[Path, str | None] = {}
        self._built: set[str] = set()
        self._checked: set[str] = set()
        self._actor_locks: dict[str, asyncio.Lock] = {}
        #: The image a start is building, by its session id, with the locks it holds until its start ends.
        self._building: dict[str, tuple[asyncio.Lock, NodeLock]] = {}
        #: Sandboxes whose task's compose file declares volumes (removed once the sandbox stops).
        self._with_volumes: set[str] = set()

    async def prepare(self, task: Task, trial_dir: Path, kwargs: dict[str, Any], session_id: str,
                      ) -> tuple[EnvironmentConfig, dict[str, Any]]:
        """The task's environment config for a new sandbox (its image as a prebuilt one once it exists) and the
        backend's constructor kwargs with raygrpo's compose file added (written into `trial_dir`): the sandbox's
        network is its task's one mode (`raygrpo.envs.harbor.network.static_mode`), on a bridge that the node's
        firewall guards (`raygrpo.docker.guard`, installed here on the node's first start).

        When the image does not exist yet, this sandbox (`session_id`) is the node's one to build it, possibly
        after waiting for another that was building it and failed: it holds the build until `release`.
        """
        from harbor.models.task.config import NetworkMode

        offline = static_mode(self.label, task, "docker") == NetworkMode.NO_NETWORK
        await asyncio.to_thread(docker_guard.ensure)
        config = task.config.environment.model_copy(deep=True)
        name = await self._image_name(task)
        if name is not None and (await self._exists(name) or not await self._claim_build(name, session_id)):
            config.docker_image = name
        labels = {**owner_labels(), SESSION_LABEL: session_id}
        sidecars = None
        compose_file = task.paths.environment_dir / COMPOSE_FILE
        if compose_file.is_file():
            compose = await asyncio.to_thread(read_compose, compose_file)
            sidecars = sidecar_overlay(compose, labels, name)
            if declares_volumes(compose):
                self._with_volumes.add(session_id)
        overlay = write_overlay(trial_dir / OVERLAY_NAME, labels, image=name,
                                bridge=docker_guard.bridge_name(session_id), offline=offline, sidecars=sidecars,
                                built_once=name is not None and config.docker_image != name)
        extra = [str(p) for p in kwargs.get("extra_docker_compose") or []]
        return config, {**kwargs, "extra_docker_compose": [*extra, str(overlay)]}

    async def _claim_build(self, name: str, session_id: str) -> bool:
        """Wait until no other start on this node builds `name`; True when it still does not exist and this start
        now holds its build, False when it exists (built meanwhile)."""
        actor_lock = self._actor_locks.setdefault(name, asyncio.Lock())
        if actor_lock.locked():
            logger.debug("%s: waiting for another sandbox's build of the image %s", self.label, name)
        await actor_lock.acquire()
        node_lock = NodeLock(build_lock_path(name))
        try:
            if name not in self._built:
                await node_lock.acquire()
                if await asyncio.to_thread(image_exists, name):
                    self._built.add(name)
            if name in self._built:
                node_lock.release()
                actor_lock.release()
                return False
        except BaseException:
            node_lock.release()
            actor_lock.release()
            raise
        self._building[session_id] = (actor_lock, node_lock)
        return True

    def release(self, session_id: str) -> None:
        """The start of sandbox `session_id` ended (started, failed or cancelled): the build it held, if any, is
        over; the next start waiting for the image looks whether it exists now."""
        held = self._building.pop(session_id, None)
        if held is not None:
            actor_lock, node_lock = held
            node_lock.release()
            actor_lock.release()

    async def stopped(self, session_id: str) -> None:
        """Sandbox `session_id` was stopped (`docker compose down`, which keeps named volumes): the volumes its
        task's compose file declared are removed (found by the sandbox's label). Never raises: what is left is
        counted by the run's leak count and removed by the reaper."""
        if session_id not in self._with_volumes:
            return
        self._with_volumes.discard(session_id)
        try:
            volumes = await asyncio.to_thread(find, [f"{SESSION_LABEL}={session_id}"], ("volume",))
            left = await asyncio.to_thread(remove, volumes)
        except DockerUnavailable as exc:
            logger.warning("%s: the volumes of sandbox %s were not removed: %s", self.label, session_id, exc)
            return
        if left:
            logger.warning("%s: volumes of sandbox %s still there: %s", self.label, session_id,
                           ", ".join(v.name for v in left))

    def started(self, task: Task) -> None:
        """A sandbox of `task` started: its image exists on this node now."""
        name = self._image_names.get(task.paths.environment_dir)
        if name is not None:
            self._built.add(name)

    async def start_failed(self, task: Task | None, exc: BaseException) -> TaskError | None:
        """The `TaskError` a failed start means (its image does not build, or an image it names cannot be pulled),
        or None for an infrastructure failure.
        A start from a reused image that failed forgets the image, so that the next start builds it again."""
        if task is not None:
            self._built.discard(self._image_names.get(task.paths.environment_dir) or "")
        name = task.name if task is not None else "?"
        pulled = pull_failure(str(exc))
        if pulled is not None:
            return TaskError(f"{self.label} task {name}: {pulled}")
        failure = build_failure(str(exc))
        if failure is None:
            return None
        if failure.container is not None:
            await asyncio.to_thread(remove, [DockerObject("container", failure.container, failure.container)])
        return TaskError(f"{self.label} task {name}: the task's image does not build: {failure}")

    @staticmethod
    def explain(exc: BaseException) -> str | None:
        """The daemon's own line for a start that failed in a compose command (`docker compose up failed (exit 1):
        ...`), whole; None when the failure was not a compose command's."""
        return explain_compose(str(exc))

    async def _image_name(self, task: Task) -> str | None:
        env_dir = task.paths.environment_dir
        if env_dir not in self._image_names:
            self._image_names[env_dir] = await asyncio.to_thread(_image_name, task)
        return self._image_names[env_dir]

    async def _exists(self, name: str) -> bool:
        if name not in self._built and name not in self._checked:
            # Once per task and actor: an image that an earlier actor or run built is reused too.
            self._checked.add(name)
            if await asyncio.to_thread(image_exists, name):
                self._built.add(name)
        return name in self._built


def build_lock_path(image: str) -> Path:
    """The file every process of this node locks while it builds `image` (in `shared_tempdir`, never in a process's
    own temp dir: two actors that each locked a private file would build the image at once)."""
    return shared_tempdir() / BUILD_LOCK_DIR_NAME / f"{image}.lock"


class NodeLock:
    """An exclusive lock shared by the processes of one node: `flock` on `path`, taken by polling so that waiting
    for it stays cancellable; the kernel drops it when its holder dies.

    Args:
        path: The lock file (created with its folder).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    async def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            waiting = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waiting:
                        waiting = True
                        logger.info("waiting for another process on this node to release %s", self.path)
                    await asyncio.sleep(_LOCK_POLL_S)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _image_name(task: Task) -> str | None:
    """`hb__` + the task's environment folder's content hash, as Harbor 0.25 computes it (`environment_id`); None
    when the task names its own image (Harbor then starts from it). A task with compose services gets one too: its
    own services' images are named after it (`raygrpo.docker.sidecars`)."""
    from harbor.environments.definition import environment_content_hash

    env_dir = task.paths.environment_dir
    if task.config.environment.docker_image:
        return None
    return f"hb__{environment_content_hash(env_dir)}"
