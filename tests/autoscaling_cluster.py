"""A Ray cluster with the (fake) autoscaler on this machine, started and stopped without touching any other Ray.

Why: `ray.cluster_utils.AutoscalingCluster` is how Ray tests its autoscaler on one machine (worker nodes are started
by the autoscaler's own monitor process, through the fake multi-node provider), but as shipped in ray 2.60 it
cannot be used here: its config template (`fake_multi_node/example.yaml`) is missing from the wheel, and its
`start` / `shutdown` run `ray stop --force`, which kills every Ray on the machine, other people's included.

`LocalAutoscalingCluster` keeps its idea (a head started with `--autoscaling-config` and `RAY_FAKE_CLUSTER=1`) and
changes what broke:

- the cluster config is written here, as a dict (autoscaler v1: v2 loads the missing template to fill defaults);
- the head is `ray start --head --block` run as a child process on 127.0.0.1, in a temp dir of its own, on free
  ports, with `RAY_AUTH_MODE` set explicitly; the fake provider is told the GCS address on 127.0.0.1 (Ray would
  otherwise rewrite it to the machine's address), and the worker nodes it starts inherit the head's environment;
- `shutdown` stops the head's process group, then kills by pid every process whose command line names the
  cluster's temp dir (the fake worker nodes' raylets, agents and workers all do), and checks that none is left.

Use it as a context manager; the driver joins with `ray.init(address=cluster.address)` in an environment that has
`cluster.driver_env` (the loopback setting and the auth mode).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from ray.cluster_utils import AutoscalingCluster

from tests.ray_procs import listen_ports, processes_naming, stop_cluster

RAY = str(Path(sys.executable).with_name("ray"))
REPO = Path(__file__).resolve().parent.parent

#: Ports `ray start` otherwise takes at fixed defaults, which another Ray on this machine may hold.
_OWN_PORTS = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
              "--metrics-export-port", "--node-manager-port", "--object-manager-port", "--ray-client-server-port")

#: What every process of the cluster and its driver need: Ray on loopback, token auth off (explicitly, never mixed).
DRIVER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


class LocalAutoscalingCluster(AutoscalingCluster):
    """A head on 127.0.0.1 whose autoscaler adds and removes fake worker nodes on this machine (see the module
    docstring).

    Args:
        head_resources: The head's resources (`CPU` and custom ones); give it none that worker types carry, so every
            actor asking for those needs a new node.
        worker_node_types: Autoscaler node types: name to `{"resources": {...}, "min_workers": int,
            "max_workers": int}` (`node_config` is filled in).
        idle_timeout_minutes: How long a worker node with nothing on it lives on.
        upscaling_speed: How many nodes may be pending at once, relative to those running (v1's knob).
        env: Extra environment of every cluster process (the fake nodes inherit it from the head).
    """

    def __init__(self, head_resources: dict[str, float], worker_node_types: dict[str, dict[str, Any]], *,
                 idle_timeout_minutes: float = 0.05, upscaling_speed: float = 10.0,
                 env: dict[str, str] | None = None) -> None:
        self.temp_dir = Path(f"/tmp/rga-{secrets.token_hex(3)}")  # short: Ray's socket paths live under it
        (self.gcs_port,) = listen_ports(1)
        self.extra_env = dict(env or {})
        self._proc: subprocess.Popen | None = None
        self._config_path = self.temp_dir.with_suffix(".json")
        super().__init__(dict(head_resources), worker_node_types, autoscaler_v2=False,
                         idle_timeout_minutes=idle_timeout_minutes, upscaling_speed=upscaling_speed,
                         max_workers=sum(int(t.get("max_workers", 0)) for t in worker_node_types.values()))

    @property
    def address(self) -> str:
        """The GCS address a driver joins."""
        return f"127.0.0.1:{self.gcs_port}"

    def _generate_config(self, head_resources: dict[str, float], worker_node_types: dict[str, dict[str, Any]],
                         autoscaler_v2: bool = False, **config_kwargs: Any) -> dict[str, Any]:
        """The cluster config: a fake multi-node provider that reaches the GCS on 127.0.0.1, no node updaters (the
        provider starts nodes itself), the given node types, and no commands or file mounts."""
        node_types = {name: {"node_config": {}, "min_workers": 0, **spec} for name, spec in worker_node_types.items()}
        node_types["ray.head.default"] = {"resources": dict(head_resources), "node_config": {}, "max_workers": 0}
        config: dict[str, Any] = {
            "cluster_name": f"raygrpo-{self.temp_dir.name}",
            "max_workers": 0,
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": 5,
            "docker": {},
            "provider": {
                "type": "fake_multinode",
                "gcs_address": self.address,
                "use_node_id_as_ip": True,  # every fake node has the same IP: the autoscaler keys them by node id
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "launch_multiple": True,  # start as many nodes per launch as asked, not one
            },
            "auth": {"ssh_user": "ray"},
            "available_node_types": node_types,
            "head_node_type": "ray.head.default",
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }
        config.update(config_kwargs)
        return config

    @property
    def config(self) -> dict[str, Any]:
        return self._config

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(DRIVER_ENV)
        env.update({
            "RAY_FAKE_CLUSTER": "1",  # the fake provider refuses to run without it
            "RAY_enable_autoscaler_v2": "0",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])),
        })
        env.update(self.extra_env)
        return env

    def start(self, _system_config: dict[str, Any] | None = None, override_env: dict[str, str] | None = None,
              timeout_s: float = 90.0) -> None:
        """Start the head (and with it the autoscaler) and wait until its GCS answers.

        Raises:
            RuntimeError: The head exited or did not answer within `timeout_s`.
        """
        from ray.autoscaler._private.util import validate_config

        validate_config(self._config)  # against Ray's schema, so a bad config fails here, not in the monitor's log
        self.temp_dir.mkdir(parents=True)
        self._config_path.write_text(json.dumps(self._config))
        resources = dict(self._head_resources)
        cmd = [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
               "--autoscaling-config", str(self._config_path), "--num-cpus", str(int(resources.pop("CPU", 1))),
               "--temp-dir", str(self.temp_dir), "--include-dashboard", "false", "--disable-usage-stats",
               *(arg for flag, port in zip(_OWN_PORTS, listen_ports(len(_OWN_PORTS))) for arg in (flag, str(port)))]
        if resources:
            cmd += ["--resources", json.dumps(resources)]
        if _system_config:
            cmd += ["--system-config", json.dumps(_system_config, separators=(",", ":"))]
        env = {**self._env(), **(override_env or {})}
        self._proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"`ray start --head` exited with {self._proc.returncode}; logs under "
                                   f"{self.temp_dir}/session_latest/logs")
            if self._head_up():
                self._report_node_types()
                return
            time.sleep(0.5)
        raise RuntimeError(f"the head at {self.address} did not come up within {timeout_s:g} s")

    def _head_up(self) -> bool:
        """Whether the head's raylet registered (its log says so once the node is up)."""
        logs = self.temp_dir / "session_latest" / "logs"
        raylet = logs / "raylet.out"
        return raylet.exists() and "Raylet of id" in raylet.read_text(errors="replace") and \
            any(logs.glob("monitor.*"))

    def _report_node_types(self) -> None:
        """Put the worker node types in the GCS as the cluster config an autoscaler reports (`ClusterConfig` under
        the autoscaler-state namespace, which `ray._private.state.state.get_cluster_config()` reads).

        Autoscaler v2 (`ray up` since Ray 2.50, KubeRay) reports it; v1, which this cluster has to run, does not.
        raygrpo's start-time placement check reads it to tell a resource an autoscaler can add from one that no
        node will ever offer, so without it every run here would be refused at start.
        """
        import ray
        from ray._raylet import GcsClient
        from ray.core.generated import autoscaler_pb2

        config = autoscaler_pb2.ClusterConfig()
        for name, spec in self._config["available_node_types"].items():
            if name == self._config["head_node_type"]:
                continue
            group = config.node_group_configs.add()
            group.name = name
            group.min_count = int(spec.get("min_workers", 0))
            group.max_count = int(spec.get("max_workers", 0))
            group.resources.update({k: int(v) for k, v in spec["resources"].items()})
        GcsClient(address=self.address).internal_kv_put(
            ray._raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY.encode(), config.SerializeToString(), True,
            ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode())

    def own_processes(self) -> list[psutil.Process]:
        """This cluster's processes still running: those whose command line names its temp dir."""
        return processes_naming(self.temp_dir)

    def shutdown(self) -> None:
        """Stop the head's process group, then every process that names the temp dir, by pid; remove the temp dir.

        Raises:
            RuntimeError: Some of the cluster's processes survived SIGKILL.
        """
        # A dying monitor may still be starting a node: look three times.
        left = stop_cluster(self._proc, self.temp_dir, grace_s=10.0, rounds=3)
        self._proc = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self._config_path.unlink(missing_ok=True)
        if left:
            raise RuntimeError(f"processes of the cluster in {self.temp_dir} survived: {[p.pid for p in left]}")

    def connect(self, **kwargs: Any) -> None:
        """Join the cluster from this process (`ray.init`), on loopback and with the cluster's auth mode; the
        variables of `DRIVER_ENV` are set in this process's environment (Ray reads some of them at import).

        Args:
            **kwargs: Passed on to `ray.init` (`runtime_env` gets the repository on `PYTHONPATH` added).
        """
        import ray

        from raygrpo.core.compat import keep_ray_on_loopback
        from raygrpo.core.environ import PROCESS_ENV, apply_process_env

        os.environ.update(DRIVER_ENV)
        keep_ray_on_loopback()  # `ray` is imported already: set the constant it read from the environment
        apply_process_env()
        runtime_env = dict(kwargs.pop("runtime_env", None) or {})
        env_vars = {"PYTHONPATH": self._env()["PYTHONPATH"], **PROCESS_ENV, **runtime_env.get("env_vars", {})}
        runtime_env["env_vars"] = env_vars
        kwargs.setdefault("logging_level", "WARNING")
        ray.init(address=self.address, runtime_env=runtime_env, **kwargs)

    def __enter__(self) -> LocalAutoscalingCluster:
        try:
            self.start()
        except BaseException:
            self.shutdown()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
