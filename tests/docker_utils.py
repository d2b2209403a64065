"""Helpers for tests that run real docker sandboxes: whether they can run here, and cleaning up after them.

Docker tests need a Docker engine with the compose v2 plugin and the base images the test tasks name in `FROM`
(`make docker-dev` sets all of it up here). Where something is missing they skip with the reason; under
`RAYGRPO_REQUIRE_DOCKER=1` (CI) they fail with it instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import functools
import os
import subprocess

import pytest

from raygrpo.docker.engine import docker_problem, find, image_exists, remove, remove_images
from raygrpo.docker.owners import SANDBOX_LABEL

REQUIRE_ENV = "RAYGRPO_REQUIRE_DOCKER"
#: The base image of the example tasks and of the tasks these tests write.
BASE_IMAGE = "python:3.12-slim"
STAND_IN_LABEL = "io.raygrpo.stand-in"


@functools.cache
def docker_missing() -> str | None:
    """Why docker sandboxes cannot run here, or None (asked once per test session)."""
    problem = docker_problem()
    if problem is None and not image_exists(BASE_IMAGE):
        problem = f"the base image {BASE_IMAGE} is missing"
    return problem


def require_docker() -> None:
    """Skip the calling test where docker sandboxes cannot run, or fail it under `RAYGRPO_REQUIRE_DOCKER=1`."""
    problem = docker_missing()
    if problem is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {problem}", pytrace=False)
    pytest.skip(f"{problem} (`make docker-dev` sets docker up; {REQUIRE_ENV}=1 makes this a failure)")


def image_label(image: str, key: str) -> str | None:
    """A label of a local image (None when unset)."""
    done = subprocess.run(["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{key}"}}}}', image],
                          capture_output=True, text=True, timeout=30, check=True)
    value = done.stdout.strip()
    return None if value in ("", "<no value>") else value


def task_images() -> set[str]:
    """The images Harbor's docker backend built for tasks (`hb__*`) that this machine has."""
    done = subprocess.run(["docker", "images", "--format", "{{.Repository}}", "--filter", "reference=hb__*"],
                          capture_output=True, text=True, timeout=30, check=True)
    return set(done.stdout.split())


def sandbox_objects() -> list:
    """Every container and network of a raygrpo docker sandbox on this machine, as docker reports them."""
    return find([SANDBOX_LABEL])


@pytest.fixture
def docker_ready():
    """Docker sandboxes can run (else skip, or fail under RAYGRPO_REQUIRE_DOCKER=1); afterwards the task images the
    test built and any raygrpo sandbox it left are removed (a leak still fails the test's own assertions first)."""
    require_docker()
    before = task_images()
    yield
    remove(sandbox_objects())
    remove_images(sorted(task_images() - before))
