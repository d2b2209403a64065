"""A task's compose services (sidecars) under raygrpo's rules: labelled, their images reused, nothing left behind.

A Harbor task may bring `environment/docker-compose.yaml` with services beside `main` (a database, a web server),
named volumes and networks. Left as they are, each rollout of such a task leaves docker a named volume (`docker
compose down` without `--volumes` keeps it) and an image tag per built service (`<project>-<service>`, one project
per sandbox), and neither carries raygrpo's labels, so no leak count sees them. `sidecar_overlay` adds to the
sandbox's compose file:

- raygrpo's labels (the run, the owner, the sandbox) on every service's containers and on every volume and network the
  task declares (not `external` ones, which are not the sandbox's): the reaper and the run's leak count find them
  through docker;
- a fixed image name per service the task builds (`<task image>-<service>`, beside the main service's `hb__<hash>`):
  one tag per task and service, reused by every rollout, never one per sandbox.

After the sandbox stops, its volumes are found by the sandbox's label and removed (`raygrpo.docker.engine.find`,
`remove`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

#: The label naming the sandbox (its session id) on every object raygrpo's compose file labels.
SESSION_LABEL = "io.raygrpo.session"
_IMAGE_PART = re.compile(r"[^a-z0-9_.-]+")


def read_compose(path: Path) -> dict[str, Any]:
    """The task's compose file as a mapping ({} when it is not one)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        logger.warning("%s: not read as a compose file: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def sidecar_overlay(compose: dict[str, Any], labels: dict[str, str], image: str | None) -> dict[str, Any]:
    """What raygrpo's compose file adds for a task's compose file `compose` (see the module docstring): `labels` on
    its services, volumes and networks, and `<image>-<service>` as the image of each service it builds (none when
    `image`, the task's main image name, is None)."""
    services: dict[str, Any] = {}
    for name, service in (compose.get("services") or {}).items():
        if name == "main" or not isinstance(service, dict):
            continue
        entry: dict[str, Any] = {"labels": labels}
        if image is not None and "build" in service and "image" not in service:
            entry["image"] = f"{image}-{_IMAGE_PART.sub('-', str(name).lower())}"
        services[name] = entry
    overlay: dict[str, Any] = {"services": services}
    for section in ("volumes", "networks"):
        owned = {name: {"labels": labels} for name, spec in (compose.get(section) or {}).items()
                 if name != "default" and not (isinstance(spec, dict) and spec.get("external"))}
        if owned:
            overlay[section] = owned
    return overlay


def declares_volumes(compose: dict[str, Any]) -> bool:
    """Whether the task's compose file declares volumes of its own (removed after each sandbox)."""
    volumes = (compose.get("volumes") or {}).values()
    return any(not (isinstance(spec, dict) and spec.get("external")) for spec in volumes)
