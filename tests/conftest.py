"""Shared fixtures: one local Ray runtime per test session (on 127.0.0.1), a tiny model built once."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

from raygrpo.core.environ import apply_process_env
from raygrpo.leases.ledger import LEASE_DIR_ENV

apply_process_env()

# Leases of the tests' remote sandboxes (fake provider, e2b stand-ins) go to a folder of this session, never to the
# user's ~/.raygrpo/leases; Ray actors and subprocesses inherit it.
_LEASES = tempfile.mkdtemp(prefix="raygrpo-test-leases-")
os.environ[LEASE_DIR_ENV] = _LEASES
atexit.register(shutil.rmtree, _LEASES, True)


#: Harbor task folders used as test data: their `tests/test_outputs.py` are the tasks' own verifiers, run inside a
#: sandbox by the task's test.sh, not tests of raygrpo.
collect_ignore_glob = ["harbor_verdicts/*"]


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray runtime kept on loopback, shut down at the end of the session; the scratch folders of the actors
    that tests killed go with it."""
    from raygrpo.driver.runtime import init_ray, shutdown_ray
    from raygrpo.core.scratch import sweep_orphans

    init_ray(num_cpus=8)
    yield
    shutdown_ray()
    sweep_orphans()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random causal LM and its tokenizer, built locally (no download)."""
    from raygrpo.policy.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(str(path), seed=0)
    return os.fspath(path)
