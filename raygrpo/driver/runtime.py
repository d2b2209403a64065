"""Starting or joining Ray the way raygrpo needs it.

Where a run goes, first match wins: an explicit address (`--address`, or `ray.address` in the config), then the
`RAY_ADDRESS` environment variable (set for the entrypoint of a `ray job submit` job), then a local Ray started on
this machine and kept on the loopback interface.

Code and files travel the way Ray intends. Inside a job, the job's `runtime_env` (its `working_dir`) is inherited by
every actor on every node. Joining a cluster from outside a job, the driver's working directory becomes the
`working_dir`. A local Ray shares this machine's file system, so its workers only get the driver's import path.
Either way, on a cluster each node unpacks the working_dir to a folder of its own: `ray_ready()` returns the driver's
folder (`RayInfo.workdir`) so actors can map the config's absolute paths into theirs (`raygrpo.core.workdir`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any

from raygrpo.core.compat import keep_ray_on_loopback, reload_ray_auth_config
from raygrpo.core.environ import PROCESS_ENV, apply_process_env, log_env
from raygrpo.core.errors import ResolveError

logger = logging.getLogger(__name__)

#: What Ray leaves out of a working_dir that raygrpo uploads itself (on top of `.gitignore`, which Ray honours).
WORKING_DIR_EXCLUDES = [".git", ".venv", "runs", "__pycache__", "*.gguf", "*.safetensors"]

#: Ray settings of a local runtime, unless the caller's `_system_config` or a `RAY_<name>` variable sets them. Ray
#: starts one idle worker per CPU for tasks when the first driver connects; raygrpo runs actors, each in a worker
#: started for it, so those idle workers only cost CPU (about a tenth of raygrpo's CPU per rollout with remote
#: sandboxes, benchmarks/README.md).
LOCAL_SYSTEM_CONFIG: dict[str, Any] = {"prestart_worker_first_driver": False}
#: ... and, while it runs no dashboard, no metrics export from every Ray process to the dashboard agent.
NO_DASHBOARD_SYSTEM_CONFIG: dict[str, Any] = {"enable_metrics_collection": False}


@dataclass(frozen=True)
class RayInfo:
    """How this process is connected to Ray.

    Args:
        joined: True when the run joined an existing cluster (an address, or inside a job); False for a local Ray.
        address: The address joined, None for a local Ray.
        workdir: The driver's working_dir on a cluster (actors map paths under it into their own copy); None for a
            local Ray, whose actors share this file system.
    """

    joined: bool
    address: str | None = None
    workdir: str | None = None


#: Set by `init_ray`; `RayInfo(joined=False)` until then (and when Ray was started by someone else, e.g. a test).
_INFO: RayInfo | None = None


def in_ray_job() -> bool:
    """True inside the entrypoint of a `ray job submit` job (Ray hands it the job's config in the environment)."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    return RAY_JOB_CONFIG_JSON_ENV_VAR in os.environ


def target_address(address: str | None) -> str | None:
    """The address a run joins: `address` when given, else `RAY_ADDRESS`, else None (start a local Ray)."""
    return address or os.environ.get("RAY_ADDRESS") or None


#: Seconds a cluster's address has to take a TCP connection before a run refuses it (`check_address`).
CONNECT_TIMEOUT_S = 5.0
#: The port of a Ray client server (`ray://host`) when the address names none.
RAY_CLIENT_PORT = 10001


def check_address(address: str, field: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse, naming `field`, an address a run cannot join: a dashboard's `http://` address (where `ray job submit`
    sends jobs, not where a driver connects), or a `host:port` (a GCS; `ray://host:port`, a Ray client server) that
    takes no TCP connection within `timeout_s`.

    Ray itself waits for an unreachable GCS for good, printing only its C++ warnings ("Failed to connect to GCS"),
    so the run would hang instead of failing; `"auto"` and an address without a port are left to Ray, which finds
    or refuses them quickly.

    Raises:
        ResolveError: The address cannot be joined; the message starts with `field`.
    """
    if address.startswith(("http://", "https://")):
        raise ResolveError(
            f"{field}: {address!r} is a Ray dashboard's address, the one `ray job submit` sends jobs to; a run joins "
            "the cluster's GCS address instead (host:6379, \"auto\" on a node of the cluster), or submit the run as a "
            "job: `ray job submit --address " + address + " --working-dir . -- raygrpo ...`")
    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = target.rpartition(":")
    if address.startswith("ray://") and not (sep and port.isdigit()):
        host, port = target, str(RAY_CLIENT_PORT)
    elif not (sep and port.isdigit()):
        return  # "auto", or a form Ray resolves itself
    host = host.strip("[]")  # [::1]:6379
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        what = "Ray client server" if address.startswith("ray://") else "Ray cluster (its GCS)"
        why = f"no answer in {timeout_s:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ResolveError(
            f"{field}: no {what} answers at {address!r} ({why}): start the cluster (`ray start --head`), fix the "
            "host or port, or leave the address out for a local Ray") from exc


def init_ray(address: str | None = None, num_cpus: int | None = None, **kwargs: Any) -> RayInfo:
    """Start a local Ray runtime on 127.0.0.1, or join the cluster at `address` (see the module docstring).

    Args:
        address: None: join `RAY_ADDRESS` if it is set, else start a local runtime; `"auto"` or an address joins a
            running cluster.
        num_cpus: CPUs a local runtime advertises. A cluster's nodes advertise their own: when joining, a value
            here is reported and not passed on (Ray refuses it).
        **kwargs: Passed on to `ray.init`.

    Raises:
        ResolveError: The address is one no run can join (`check_address`), before Ray is asked to.
    """
    global _INFO
    import ray

    apply_process_env()
    if ray.is_initialized():
        return ray_info()
    field = "ray.address (--address)" if address else "RAY_ADDRESS"
    address = target_address(address)
    if address is not None and address not in ("auto", "local"):
        check_address(address, field)
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    env_vars = {**{key: os.environ[key] for key in PROCESS_ENV}, **log_env()}
    workdir: str | None = None
    if address is None:
        keep_ray_on_loopback()
        require_local_auth()
        # Workers of a local runtime import the same code as the driver: examples, file-path environments.
        paths = [os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p)]]
        env_vars["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env_vars["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    else:
        if num_cpus is not None:
            logger.warning("ray.num_cpus=%d sizes a local Ray only; joining the cluster at %s, whose nodes advertise "
                           "their own CPUs: not applied", num_cpus, address)
        workdir = os.getcwd()
        job_env = _job_runtime_env() if in_ray_job() else None
        if job_env is not None:
            # Ray merges this with the job's runtime_env and refuses a variable both set: add only what the job lacks.
            env_vars = {k: v for k, v in env_vars.items() if k not in (job_env.get("env_vars") or {})}
            if not job_env.get("working_dir"):
                logger.warning("this job has no working_dir: actors on other nodes see only what their node has; "
                               "submit with `ray job submit --working-dir .`")
                workdir = None
        elif "working_dir" not in runtime_env:
            runtime_env["working_dir"] = workdir
            runtime_env.setdefault("excludes", WORKING_DIR_EXCLUDES)
    runtime_env["env_vars"] = {**env_vars, **runtime_env.get("env_vars", {})}
    kwargs.setdefault("logging_level", logging.WARNING)
    kwargs.setdefault("log_to_driver", True)
    # Ray's core worker installs its own SIGTERM handler in the driver (it dumps a native stack and aborts): keep the
    # process's Python handler, so `ray job stop` and `kill` stop a run as cleanly as Ctrl-C.
    own_handler = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if address is None:
        kwargs.setdefault("include_dashboard", False)
        defaults = {**LOCAL_SYSTEM_CONFIG, **({} if kwargs["include_dashboard"] else NO_DASHBOARD_SYSTEM_CONFIG)}
        system_config = dict(kwargs.get("_system_config") or {})
        for key, value in defaults.items():
            if f"RAY_{key}" not in os.environ:
                system_config.setdefault(key, value)
        kwargs["_system_config"] = system_config
        # "local" always starts a runtime of our own: with no address, Ray would join a `ray start` cluster that
        # this machine happens to run (it reads /tmp/ray/ray_current_cluster) and then refuse `num_cpus`.
        ray.init(address="local", num_cpus=num_cpus, runtime_env=runtime_env, **kwargs)
    else:  # a cluster's head decides whether it has a dashboard
        ray.init(address=address, runtime_env=runtime_env, **kwargs)
    if callable(own_handler):
        signal.signal(signal.SIGTERM, own_handler)
    _INFO = RayInfo(joined=address is not None, address=address, workdir=workdir)
    logger.info("Ray ready: %s (%s)", ray.get_runtime_context().gcs_address,
                f"joined {address}" if address else "local")
    return _INFO


def require_local_auth() -> None:
    """Make the local runtime about to start require Ray's token authentication, with a random token of its own.

    A sandbox's command is untrusted: without a token, Ray's dashboard agent runs any job POSTed to it on the host
    (its job API), and the GCS takes any client. The token goes to this process's environment, which Ray's own
    processes inherit; a sandbox's environment never does. A mode the user set (`RAY_AUTH_MODE`) is kept, with a
    warning when it turns authentication off.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is None:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        reload_ray_auth_config()
    elif mode == "disabled":
        logger.warning("RAY_AUTH_MODE=disabled: the local Ray runtime takes jobs and clients without a token, from "
                       "anything that reaches its ports")


def _job_runtime_env() -> dict[str, Any]:
    """The runtime_env the job was submitted with."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    try:
        config = json.loads(os.environ[RAY_JOB_CONFIG_JSON_ENV_VAR])
    except (KeyError, ValueError):
        return {}
    return dict(config.get("runtime_env") or {})


def ray_info() -> RayInfo:
    """How this process is connected to Ray (see `RayInfo`)."""
    return _INFO or RayInfo(joined=False)


def shutdown_ray() -> None:
    global _INFO
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _INFO = None
