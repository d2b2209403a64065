"""Starting or joining Ray the way raygrpo needs it.

Locally (`address=None`) Ray is started on this machine and kept on the loopback interface; with `address="auto"`
(or a `ray://`/`host:port` address) raygrpo joins an existing cluster, e.g. inside a `ray job submit` job.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from raygrpo._compat import keep_ray_on_loopback
from raygrpo.environ import PROCESS_ENV, apply_process_env

logger = logging.getLogger(__name__)


def init_ray(address: str | None = None, num_cpus: int | None = None, **kwargs: Any) -> None:
    """Start a local Ray runtime on 127.0.0.1, or join the cluster at `address`.

    Args:
        address: None starts a local runtime; `"auto"` or an explicit address joins a running cluster.
        num_cpus: CPUs a local runtime advertises (ignored when joining a cluster).
        **kwargs: Passed on to `ray.init`.
    """
    import ray

    apply_process_env()
    if ray.is_initialized():
        return
    env_vars = {key: os.environ[key] for key in PROCESS_ENV}
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    if address is None:
        keep_ray_on_loopback()
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # Workers of a local runtime import the same code as the driver: examples, file-path environments.
        paths = [os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p)]]
        env_vars["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env_vars["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    runtime_env["env_vars"] = {**env_vars, **runtime_env.get("env_vars", {})}
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("logging_level", logging.WARNING)
    kwargs.setdefault("log_to_driver", True)
    # Ray's core worker installs its own SIGTERM handler in the driver (it dumps a native stack and aborts): keep the
    # process's Python handler, so `ray job stop` and `kill` stop a run as cleanly as Ctrl-C.
    own_handler = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if address is None:
        ray.init(num_cpus=num_cpus, runtime_env=runtime_env, **kwargs)
    else:
        ray.init(address=address, runtime_env=runtime_env, **kwargs)
    if callable(own_handler):
        signal.signal(signal.SIGTERM, own_handler)
    logger.info("Ray ready: %s", ray.get_runtime_context().gcs_address)


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
