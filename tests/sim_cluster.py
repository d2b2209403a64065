"""A simulated Ray cluster in one process tree for the multi-node acceptance tests: `ray.cluster_utils.Cluster` nodes
on 127.0.0.1, each with a custom resource `node<i>` so actors can be placed per node, and the driver joined to it.

Use it in a subprocess of its own (the test files run themselves as scripts): it must not meet the pytest session's
local Ray runtime, and a subprocess can be killed whole if it hangs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

#: Ray reads these at import and start: a simulated cluster kept on 127.0.0.1, token auth off.
CLUSTER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


@contextlib.contextmanager
def simulated_cluster(nodes: int, slots_per_node: int) -> Iterator[None]:
    """`nodes` nodes of 1 CPU, node i offering `slots_per_node` of resource `node<i>`; Ray joined until the end."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from raygrpo.core.environ import PROCESS_ENV, apply_process_env

    apply_process_env()
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import time; the variable is set before `ray` is imported
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node0": slots_per_node}, "include_dashboard": False},
    )
    try:
        for i in range(1, nodes):
            cluster.add_node(num_cpus=1, resources={f"node{i}": slots_per_node})
        cluster.wait_for_nodes(timeout=60)
        env_vars = {k: os.environ[k] for k in [*PROCESS_ENV, *CLUSTER_ENV]}
        ray.init(address=cluster.address, runtime_env={"env_vars": env_vars}, logging_level=logging.WARNING)
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()
