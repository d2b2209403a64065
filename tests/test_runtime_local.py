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
from raygrpo.driver.runtime import init_ray, shutdown_ray

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


IDLE_SCRIPT = r"""
import json, sys, time
import psutil, ray
from raygrpo.driver.runtime import init_ray, shutdown_ray

init_ray(num_cpus=4, **json.loads(sys.argv[1]))
time.sleep(4)  # Ray prestarts its idle workers right after the driver connects
idle = [p for p in psutil.Process().children(recursive=True) if "ray::IDLE" in " ".join(p.cmdline())]
config = ray._private.worker.global_worker.node._ray_params._system_config
print("RESULT", json.dumps({"idle": len(idle), "prestart": config.get("prestart_worker_first_driver"),
                            "metrics": config.get("enable_metrics_collection")}), flush=True)
shutdown_ray()
"""


def _local_ray(kwargs: dict, env: dict[str, str]) -> dict:
    import json

    done = subprocess.run([sys.executable, "-c", IDLE_SCRIPT, json.dumps(kwargs)], capture_output=True, text=True,
                          timeout=100, env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **env})
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.timeout(240)
def test_a_local_ray_starts_no_idle_workers_and_no_metrics_export_unless_the_user_sets_them():
    assert _local_ray({}, {}) == {"idle": 0, "prestart": False, "metrics": False}
    # A RAY_<name> variable or the caller's _system_config wins, as does a dashboard the caller asks for.
    theirs = _local_ray({"_system_config": {"enable_metrics_collection": True}},
                        {"RAY_prestart_worker_first_driver": "1"})
    assert theirs["idle"] > 0 and theirs["prestart"] is None and theirs["metrics"] is True
    assert _local_ray({"include_dashboard": True}, {})["metrics"] is None


JOIN = r"""
import sys
from raygrpo.core.errors import ResolveError
from raygrpo.driver.runtime import init_ray

try:
    init_ray(address=sys.argv[1] or None)
except ResolveError as exc:
    print("REFUSED", exc, flush=True)
"""


@pytest.mark.timeout(120)
def test_an_address_where_no_ray_runs_is_refused_at_once_naming_where_it_came_from():
    """Ray waits for good for a GCS that is not there (printing only its C++ warnings): `init_ray` probes the
    address first and refuses it, naming the field or variable it came from; a dashboard's http:// address (the
    one `ray job submit` takes) is refused as such."""
    port = closed_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cases = [(f"127.0.0.1:{port}", env, f"ray.address (--address): no Ray cluster (its GCS) answers at "
                                        f"'127.0.0.1:{port}'"),
             (f"ray://127.0.0.1:{port}", env, "ray.address (--address): no Ray client server answers"),
             ("", {**env, "RAY_ADDRESS": "http://127.0.0.1:8265"},
              "RAY_ADDRESS: 'http://127.0.0.1:8265' is a Ray dashboard's address, the one `ray job submit`")]
    for address, environ, refusal in cases:
        try:
            done = subprocess.run([sys.executable, "-c", JOIN, address], capture_output=True, text=True, timeout=30,
                                  env=environ)
        except subprocess.TimeoutExpired:
            pytest.fail(f"init_ray({address or environ['RAY_ADDRESS']!r}) still waited after 30 s")
        assert f"REFUSED {refusal}" in done.stdout, (done.stdout, done.stderr[-2000:])
