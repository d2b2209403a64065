"""What the Docker engine itself says: whether it answers, which containers, networks and volumes carry given labels,
and removing them. Through the `docker` CLI (the same client Harbor's docker backend calls), synchronously: callers are
the reaper's thread, the driver's leak count and test fixtures, never an event loop.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger(__name__)

#: The compose project label Docker Compose puts on every container and network of a project.
COMPOSE_PROJECT = "com.docker.compose.project"

Kind = Literal["container", "network", "volume"]
#: Every kind `find` looks for by default.
KINDS: tuple[Kind, ...] = ("container", "network", "volume")


class DockerUnavailable(RuntimeError):
    """The docker CLI is missing or the daemon does not answer."""


@dataclass(frozen=True)
class DockerObject:
    """A container, network or volume as `docker inspect` reports it.

    Args:
        kind: `"container"`, `"network"` or `"volume"`.
        id: Docker's id (a volume's name: volumes have no other).
        name: Its name.
        labels: Its labels.
    """

    kind: Kind
    id: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def project(self) -> str | None:
        """The compose project it belongs to, if any."""
        return self.labels.get(COMPOSE_PROJECT)


def _docker(*args: str, timeout_s: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker") is None:
        raise DockerUnavailable("the docker CLI is not installed")
    try:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DockerUnavailable(f"`docker {args[0]}` did not answer within {timeout_s:g} s") from None
    if check and done.returncode != 0:
        raise DockerUnavailable(f"`docker {' '.join(args[:2])}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def may_have_docker() -> bool:
    """Whether this machine could have a Docker engine to ask (the CLI and a socket or `DOCKER_HOST`): cheap, no
    subprocess, so that reapers on machines without Docker do not spawn `docker` every pass."""
    return shutil.which("docker") is not None and (
        bool(os.environ.get("DOCKER_HOST")) or os.path.exists("/var/run/docker.sock")
    )


def docker_problem(timeout_s: float = 15.0) -> str | None:
    """Why raygrpo's docker backend cannot run here (no CLI, no daemon answering, no compose v2 plugin), or None
    when it can."""
    try:
        _docker("info", "--format", "{{.ServerVersion}}", timeout_s=timeout_s)
    except DockerUnavailable as exc:
        return f"no Docker daemon answers: {exc}"
    try:
        _docker("compose", "version", "--short", timeout_s=timeout_s)
    except DockerUnavailable as exc:
        return f"the docker compose v2 plugin is missing (Harbor's docker backend calls it): {exc}"
    return None


def _inspect(kind: Kind, ids: list[str]) -> list[DockerObject]:
    if not ids:
        return []
    # An object removed between the listing and this call is missing from the answer (and the exit code is 1).
    done = _docker(kind, "inspect", *ids, check=False)
    try:
        records = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        raise DockerUnavailable(f"`docker {kind} inspect` answered: {done.stderr.strip()}") from None
    out = []
    for r in records:
        labels = (r.get("Config") or {}).get("Labels") if kind == "container" else r.get("Labels")
        name = r.get("Name", "").lstrip("/")
        out.append(DockerObject(kind, r.get("Id") or name, name, dict(labels or {})))
    return out


def find(labels: list[str], kinds: tuple[Kind, ...] = KINDS) -> list[DockerObject]:
    """Containers (running or not), networks and volumes carrying every label filter in `labels` (`key` or
    `key=value`, as `docker ps --filter label=...` takes them).

    Raises:
        DockerUnavailable: The daemon did not answer.
    """
    filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
    out: list[DockerObject] = []
    if "container" in kinds:
        ids = _docker("ps", "-a", "-q", "--no-trunc", *filters).stdout.split()
        out += _inspect("container", ids)
    if "network" in kinds:
        ids = _docker("network", "ls", "-q", "--no-trunc", *filters).stdout.split()
        out += _inspect("network", ids)
    if "volume" in kinds:
        names = _docker("volume", "ls", "-q", *filters).stdout.split()
        out += _inspect("volume", names)
    return out


def remove(objects: list[DockerObject]) -> list[DockerObject]:
    """Force-remove containers (with their anonymous volumes), then networks and volumes; returns what is still
    there. Objects already gone count as removed."""
    containers = [o.id for o in objects if o.kind == "container"]
    networks = [o.id for o in objects if o.kind == "network"]
    volumes = [o.id for o in objects if o.kind == "volume"]
    if containers:
        _docker("rm", "-f", "-v", *containers, check=False, timeout_s=120)
    if networks:
        _docker("network", "rm", *networks, check=False)
    if volumes:
        _docker("volume", "rm", "-f", *volumes, check=False)
    left = set(_docker("ps", "-a", "-q", "--no-trunc").stdout.split()) if containers else set()
    if networks:
        left |= set(_docker("network", "ls", "-q", "--no-trunc").stdout.split())
    if volumes:
        left |= set(_docker("volume", "ls", "-q").stdout.split())
    return [o for o in objects if o.id in left]


def image_exists(name: str) -> bool:
    """Whether the engine has an image by that name (no pull is attempted); False when it does not answer."""
    try:
        return _docker("image", "inspect", "--format", "{{.Id}}", name, check=False).returncode == 0
    except DockerUnavailable:
        return False


def remove_images(names: list[str]) -> None:
    """Remove images by name (those missing are ignored)."""
    if names:
        _docker("rmi", "-f", *names, check=False, timeout_s=120)
