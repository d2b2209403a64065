"""A local run starts a Ray of its own, even where this machine runs a `ray start` cluster.

Ray's `ray.init()` with no address joins the cluster recorded in `<temp dir>/ray_current_cluster` (the last
`ray start` on this machine) if there is one; a laptop run of raygrpo must not. The test points that record at an
address where nothing listens, in a temp dir of its own, and starts a run's Ray in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.ors_utils import closed_port

SCRIPT = r"""
import sys
import ray
from raygrpo.runtime import init_ray, shutdown_ray

info = init_ray(num_cpus=1, _temp_dir=sys.argv[1])
print("RESULT", info.joined, ray.cluster_resources().get("CPU"), flush=True)
shutdown_ray()
"""


@pytest.mark.timeout(120)
def test_a_local_run_ignores_the_machines_recorded_cluster():
    import tempfile
    from pathlib import Path

    temp_dir = Path(tempfile.mkdtemp(prefix="rgl-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 bytes
    (temp_dir / "ray_current_cluster").write_text(f"127.0.0.1:{closed_port()}")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(temp_dir)], capture_output=True, text=True, timeout=100,
                          env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    import shutil

    shutil.rmtree(temp_dir, ignore_errors=True)
    assert "RESULT False 1.0" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
