"""Owner labels on docker sandboxes, and reaping those whose owner died, through docker itself.

Every docker sandbox raygrpo starts (a compose project of Harbor's docker backend) gets an extra compose file
(`compose_overlay`) that runs its main service under an init and labels its containers and its default network with
the run and the owner: the owning process's pid and that pid's start time, hostname, boot id and owner id (the Ray
actor name), as `raygrpo.sandbox.owners.owner_record` describes them. Docker keeps the labels, so what is left of
a run, and which sandboxes lost their owner, is a `docker ps -a --filter label=...` away, whatever raygrpo's own
bookkeeping says.

The init matters for stops: Harbor's main service runs `sleep infinity` as PID 1, which ignores SIGTERM, so each
`docker compose down` waits out Docker's 10 s stop timeout; under an init (`init: true`, Docker's tini) the stop
takes a fraction of a second.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from raygrpo.docker.engine import COMPOSE_PROJECT, DockerObject, find, remove
from raygrpo.docker.guard import BRIDGE_NAME_OPTION
from raygrpo.sandbox.owners import HOSTNAME, RUN_ENV, owner_alive, owner_record

logger = logging.getLogger(__name__)

PREFIX = "io.raygrpo."
#: Every docker object of a raygrpo sandbox carries this label (value "true").
SANDBOX_LABEL = f"{PREFIX}sandbox"
RUN_LABEL = f"{PREFIX}run"
#: owner_record key -> label.
_OWNER_LABELS = {
    "owner_id": f"{PREFIX}owner",
    "pid": f"{PREFIX}owner.pid",
    "pid_start": f"{PREFIX}owner.pid-start",
    "hostname": f"{PREFIX}owner.host",
    "boot_id": f"{PREFIX}owner.boot",
}


def owner_labels(run_id: str | None = None) -> dict[str, str]:
    """The labels of a sandbox this process starts now: the sandbox mark, the run (`run_id`, else
    `$RAYGRPO_RUN_ID`, else empty) and this process as its owner."""
    owner = owner_record()
    labels = {SANDBOX_LABEL: "true", RUN_LABEL: run_id or os.environ.get(RUN_ENV, "")}
    for key, label in _OWNER_LABELS.items():
        value = owner.get(key)
        labels[label] = "" if value is None else repr(value) if isinstance(value, float) else str(value)
    return labels


def owner_of(labels: dict[str, str]) -> dict:
    """The `owner_record` a sandbox's labels describe (what `owner_alive` judges)."""
    raw = {key: labels.get(label, "") for key, label in _OWNER_LABELS.items()}
    return {
        "owner_id": raw["owner_id"] or None,
        "pid": int(raw["pid"]) if raw["pid"].isdigit() else None,
        "pid_start": float(raw["pid_start"]) if raw["pid_start"] else None,
        "hostname": raw["hostname"],
        "boot_id": raw["boot_id"],
    }


def compose_overlay(labels: dict[str, str], image: str | None = None, *, bridge: str | None = None,
                    offline: bool = False, sidecars: dict | None = None, built_once: bool = False) -> dict:
    """The extra compose file of a sandbox: its main service under an init, its containers and default network
    labelled, and (when `image` is given) the name its image is built as or started from. `bridge` names the
    default network's interface on the host (`raygrpo.docker.guard.bridge_name`: the node's firewall
    guards it); `offline` gives the main service no network at all (a `no-network` task); `sidecars` is what the
    task's own compose services add (`raygrpo.docker.sidecars.sidecar_overlay`). `built_once`: the start builds the
    image (`docker compose build`), and `up` must not build it again (Harbor's compose file says `pull_policy:
    build`): a second build of the same content may take the cached layers of another task's identical image and
    move the tag, leaving the first build dangling."""
    main: dict = {"init": True, "labels": labels}
    if image is not None:
        main["image"] = image
        if built_once:
            main["pull_policy"] = "missing"
    if offline:
        main["network_mode"] = "none"
    network: dict = {"labels": labels}
    if bridge is not None:
        network["driver_opts"] = {BRIDGE_NAME_OPTION: bridge}
    overlay: dict = {"services": {"main": main}, "networks": {"default": network}}
    for section, entries in (sidecars or {}).items():
        overlay.setdefault(section, {}).update(entries)
    return overlay


def write_overlay(path: Path, labels: dict[str, str], image: str | None = None, *, bridge: str | None = None,
                  offline: bool = False, sidecars: dict | None = None, built_once: bool = False) -> Path:
    """Write `compose_overlay(...)` to `path` (JSON, which compose reads as YAML) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    overlay = compose_overlay(labels, image, bridge=bridge, offline=offline, sidecars=sidecars, built_once=built_once)
    path.write_text(json.dumps(overlay, indent=2))
    return path


def _project_key(obj: DockerObject) -> str:
    return obj.project or obj.name


def orphaned(objects: list[DockerObject]) -> set[str]:
    """Compose projects among `objects` (raygrpo-labelled) whose owner is dead. Owners on other hosts (a shared
    remote engine) are left to their own host's reaper."""
    projects: set[str] = set()
    for obj in objects:
        owner = owner_of(obj.labels)
        if owner["pid"] is None or owner["hostname"] != HOSTNAME:
            continue
        if not owner_alive(owner):
            projects.add(_project_key(obj))
    return projects


def reap_docker_orphans() -> list[str]:
    """Remove every container and network of each raygrpo sandbox on this host whose owner died; returns the compose
    projects reaped. Concurrent reapers are harmless (removing what is already gone is a no-op).

    Raises:
        DockerUnavailable: The daemon did not answer.
    """
    projects = orphaned(find([SANDBOX_LABEL]))
    for project in sorted(projects):
        # Every object of the project, sidecars without raygrpo's labels included.
        objects = find([f"{COMPOSE_PROJECT}={project}"])
        owner = owner_of(objects[0].labels) if objects else {}
        logger.warning("reaping orphaned docker sandbox %s (%d object(s); owner pid %s, owner id %s)",
                       project, len(objects), owner.get("pid"), owner.get("owner_id"))
        left = remove(objects)
        if left:
            logger.warning("docker sandbox %s: %s still there after removal", project, [o.name for o in left])
    return sorted(projects)


def run_leftovers(run_id: str) -> list[str]:
    """The compose projects of run `run_id` that docker still has containers, networks or volumes of.

    Raises:
        DockerUnavailable: The daemon did not answer.
    """
    return sorted({_project_key(o) for o in find([f"{RUN_LABEL}={run_id}"])})
