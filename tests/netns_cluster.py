"""A real multi-node Ray cluster on one machine: one Ray node per Linux network namespace.

Why: `ray.cluster_utils.Cluster` simulates nodes inside one network stack, so every node shares the host's IP and
a "partition" or a lost host cannot be expressed. Here each node is a separate network namespace with its own IP
on a private bridge, so Ray sees distinct node IPs and a fault test can take a whole host away (`kill_node`) or
cut its link (`partition` / `heal`), as on a real cluster. DESIGN.md section 4 ("Several hosts on one machine",
"Token auth") lists the facts this rests on.

What `NetnsCluster` builds, and removes again on exit (exactly what it created, nothing machine-wide):

- a bridge `rgb<id>` with an address on a private /24 (`10.213.X.0/24`, X chosen so no route of the host overlaps);
- one namespace per node (`rgns<id>n<i>`) joined to the bridge by a veth pair, with `lo` up and a default route
  via the bridge's address (so the host's namespace reaches every node and the nodes reach each other);
- iptables rules that let bridged traffic through Docker's `FORWARD` chain (policy DROP with `br_netfilter` once
  dockerd has run), accept host <-> node traffic on the bridge, and drop anything the nodes try to route off the
  bridge (tests talk to these test hosts only); each rule carries the comment `rgns-<id>`;
- `ray start --head` in the first namespace and `ray start --address` in the others, token auth on
  (`RAY_AUTH_MODE=token`, one random `RAY_AUTH_TOKEN` for every process), each node with its own short temp dir
  under `/tmp/rgns-<id>/`.

It needs root, iproute2 (`ip`) and iptables. Tests call `require_netns()` (or use the `netns_ready` fixture):
it skips where a prerequisite is missing, and fails instead when `RAYGRPO_REQUIRE_NETNS=1` (CI), so a broken
harness cannot pass as a skip.

Teardown kills every process living in the namespaces (including ones started there later), deletes the
namespaces, veth pairs, bridge and rules, and removes the temp dirs. It runs on `__exit__`, on a failed
`__enter__`, at interpreter exit (atexit), and -- for a run killed before any of that -- the next `NetnsCluster`
reaps the leftovers of instances whose owning process is dead (`reap_stale`), using the state file each instance
writes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import ipaddress
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest

from raygrpo.sandbox.os_probe import proc_start_ticks

logger = logging.getLogger(__name__)

REQUIRE_ENV = "RAYGRPO_REQUIRE_NETNS"
#: Where instances keep their temp dirs and state files: `/tmp/rgns-<id>/` (short: Unix socket paths <= 107 bytes).
TEMP_ROOT = Path("/tmp")
TEMP_PREFIX = "rgns-"
#: First two octets of the private subnets the harness uses; the third is random per instance.
SUBNET_PREFIX = "10.213"
#: Environment variables a harness process must not inherit: the first forces Ray onto loopback and refuses
#: worker nodes, the others would point Ray at another cluster or another token.
STRIPPED_ENV = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_NODE_IP_ADDRESS",
                "RAY_AUTH_TOKEN", "RAY_AUTH_MODE")
_NODE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,15}$")
_PROBE_PORT = 39_999
_REPO = Path(__file__).resolve().parent.parent
_CMD_TIMEOUT = 30.0


class NetnsError(RuntimeError):
    """Setting up or tearing down the namespaced cluster failed."""


@dataclass(frozen=True)
class NodeSpec:
    """One Ray node: its name (short: `[a-z][a-z0-9_-]{0,15}`), CPUs, custom resources and labels."""

    name: str
    num_cpus: int = 1
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Object store size in bytes (Ray's minimum is ~75 MiB); small keeps four nodes cheap on a small machine.
    object_store_memory: int = 100 * 1024 * 1024
    #: Extra environment of the node's `ray start` (its workers inherit it), e.g. a sandbox root of its own.
    env: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------------
# Prerequisites


@functools.cache
def netns_missing() -> str | None:
    """Why the harness cannot run here, or None (asked once per process)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the netns cluster harness needs root (network namespaces, bridge, iptables)"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian package {package})"
    if _ray_bin() is None:
        return "the `ray` command is not installed next to this Python"
    for argv in (["ip", "netns", "list"], ["iptables", "-w", "5", "-S", "FORWARD"], ["ip", "link", "show", "lo"]):
        try:
            done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=_CMD_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{' '.join(argv)}` failed: {exc}"
        if done.returncode != 0:
            return f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}"
    return None


def require_netns() -> None:
    """Skip the calling test where the harness cannot run, or fail it under `RAYGRPO_REQUIRE_NETNS=1`."""
    problem = netns_missing()
    if problem is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {problem}", pytrace=False)
    pytest.skip(f"{problem} ({REQUIRE_ENV}=1 makes this a failure)")


@pytest.fixture
def netns_ready() -> None:
    """The harness can run here (else skip, or fail under `RAYGRPO_REQUIRE_NETNS=1`)."""
    require_netns()


# --------------------------------------------------------------------------------------------------------------
# Small helpers


def _ray_bin() -> str | None:
    candidate = Path(sys.executable).parent / "ray"
    if candidate.exists():
        return str(candidate)
    return shutil.which("ray")


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = _CMD_TIMEOUT,
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (with a timeout), logging it; raise `NetnsError` with its stderr when `check` and it fails."""
    logger.debug("run: %s", " ".join(argv))
    done = subprocess.run(list(argv), check=False, capture_output=True, text=True, timeout=timeout,
                          env=dict(env) if env is not None else None)
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def process_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether a process runs (not a zombie) and, when `start_time` is given, is the same one (not a reused pid)."""
    now = proc_start_ticks(pid)
    return now is not None and (start_time is None or now == start_time)


def namespace_pids(netns: str) -> list[int]:
    """The pids of the processes living in a named network namespace (what `ip netns pids NETNS` prints)."""
    try:
        target = os.stat(f"/run/netns/{netns}")
    except FileNotFoundError:
        return []
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue
        if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino):
            pids.append(int(entry.name))
    return pids


def _kill_pids_in(namespaces: Sequence[str], grace: float | None) -> dict[int, int]:
    """SIGTERM every process in the namespaces, wait up to `grace` s, then SIGKILL until none is left (with
    `grace=None`, SIGKILL at once: a crash, no graceful shutdown).

    Returns {pid: start time} of every process it signalled. Processes that appear meanwhile (a raylet starting a
    worker) are signalled too.
    """
    signalled: dict[int, int] = {}

    def sweep(sig: int) -> int:
        count = 0
        for netns in namespaces:
            for pid in namespace_pids(netns):
                start = proc_start_ticks(pid)
                if start is None:
                    continue
                signalled.setdefault(pid, start)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                count += 1
        return count

    if grace is not None:
        if sweep(signal.SIGTERM) == 0:
            return signalled
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if not any(namespace_pids(ns) for ns in namespaces):
                return signalled
    if grace is not None and logger.isEnabledFor(logging.DEBUG):
        for pid in (pid for ns in namespaces for pid in namespace_pids(ns)):
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
                logger.debug("pid %d survived SIGTERM for %.1f s: %s", pid, grace, cmd.decode(errors="replace"))
    deadline = time.monotonic() + 20.0
    while sweep(signal.SIGKILL) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {ns: namespace_pids(ns) for ns in namespaces if namespace_pids(ns)}
    if left:
        raise NetnsError(f"processes survived SIGKILL in {left}")
    return signalled


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Serialise subnet choice between harness instances on this machine."""
    with open(TEMP_ROOT / "rgns.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix the host routes or has an address on (all routing tables)."""
    used: list[ipaddress.IPv4Network] = []
    routes = json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]")
    for route in routes:
        dst = route.get("dst", "default")
        if dst == "default":
            continue
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(dst, strict=False))
    for link in json.loads(_run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    return used


_LISTENER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); s.settimeout(float(sys.argv[3]))
print("ready", flush=True)
while True:
    try:
        c, _ = s.accept()
    except OSError:
        break
    c.sendall(b"ok"); c.close()
"""
_PROBER = """
import json, socket, sys
out = {}
for addr in sys.argv[3:]:
    try:
        with socket.create_connection((addr, int(sys.argv[2])), timeout=float(sys.argv[1])) as c:
            out[addr] = c.recv(2) == b"ok"
    except OSError as exc:
        out[addr] = repr(exc)
print(json.dumps(out))
"""
_NODES = """
import json, sys, time
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo
address, want, timeout, exact = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "exact"
deadline = time.monotonic() + timeout
nodes, error = [], None
while True:
    try:
        infos = GcsClient(address=address).get_all_node_info(timeout=5).values()
        nodes = [{"node_id": i.node_id.hex(), "ip": i.node_manager_address, "name": i.node_name,
                  "alive": i.state == GcsNodeInfo.GcsNodeState.ALIVE, "head": i.is_head_node,
                  "resources": dict(i.resources_total)} for i in infos]
        error = None
    except Exception as exc:
        error = repr(exc)
    alive = sum(n["alive"] for n in nodes)
    if (error is None and (alive == want if exact else alive >= want)) or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps({"nodes": nodes, "error": error}))
"""


# --------------------------------------------------------------------------------------------------------------
# The cluster


@dataclass
class _Node:
    spec: NodeSpec
    index: int
    netns: str
    ip: str
    host_veth: str
    temp_dir: Path


class NetnsCluster:
    """A Ray cluster with one node per network namespace on a private bridge; a context manager.

    `head` (default: `NodeSpec("head")`, no custom resources) runs GCS, dashboard and client server; each of
    `workers` joins it. After `__enter__` every node is alive and `gcs_address`, `dashboard_url`,
    `client_address` and `env()` tell a client in the host's namespace how to reach it. With `start_ray=False`
    only the network is built (namespaces, bridge, rules, connectivity checked).
    """

    def __init__(self, workers: Sequence[NodeSpec] = (), head: NodeSpec | None = None, *, start_ray: bool = True,
                 gcs_port: int = 6379, dashboard_port: int = 8265, client_port: int = 10001,
                 start_timeout: float = 180.0, system_config: Mapping[str, Any] | None = None,
                 kill_grace: float = 3.0) -> None:
        specs = [head or NodeSpec("head"), *workers]
        names = [spec.name for spec in specs]
        bad = [name for name in names if not _NODE_NAME.match(name)]
        if bad:
            raise ValueError(f"node names must match {_NODE_NAME.pattern}: {bad}")
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be distinct: {names}")
        if len(specs) > 200:
            raise ValueError("at most 200 nodes fit the /24")
        self.id: str = secrets.token_hex(3)
        self.specs: list[NodeSpec] = specs
        self.start_ray = start_ray
        self.gcs_port = gcs_port
        self.dashboard_port = dashboard_port
        self.client_port = client_port
        self.start_timeout = start_timeout
        self.system_config = dict(system_config or {})
        self.kill_grace = kill_grace
        self.token: str = secrets.token_hex(32)
        self.bridge: str = f"rgb{self.id}"
        self.comment: str = f"rgns-{self.id}"
        self.temp_root: Path = TEMP_ROOT / f"{TEMP_PREFIX}{self.id}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge_ip: str = ""
        self.gcs_address: str = ""
        self.dashboard_url: str = ""
        self.client_address: str = ""
        #: Seconds spent: "network", "ray" ("ray_head" + "ray_workers" + waiting for nodes and dashboard),
        #: "setup" (all of it), "teardown".
        self.timings: dict[str, float] = {}
        #: {pid: start time} of every process teardown or `kill_node` signalled (to check none survived).
        self.killed: dict[int, int] = {}
        self._nodes: dict[str, _Node] = {}
        self._netns_created: list[str] = []
        self._bridge_created = False
        self._temp_created = False
        self._rules: list[list[str]] = []
        self._popens: list[subprocess.Popen[Any]] = []
        self._closed = False
        self._atexit_registered = False

    # ---------------------------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Build the network, check it, start Ray and wait for every node; on any failure tear down and raise."""
        if self._closed or self._nodes:
            raise NetnsError("a NetnsCluster starts once")
        reap_stale()
        atexit.register(self.close)
        self._atexit_registered = True
        began = time.monotonic()
        try:
            self._build_network()
            self.timings["network"] = time.monotonic() - began
            if self.start_ray:
                ray_began = time.monotonic()
                self._start_ray()
                self.timings["ray"] = time.monotonic() - ray_began
        except BaseException:
            logger.exception("netns cluster %s failed to start; tearing down", self.id)
            try:
                self.close()
            except NetnsError:
                logger.exception("netns cluster %s: teardown after the failed start", self.id)
            raise
        self.timings["setup"] = time.monotonic() - began
        logger.info("netns cluster %s up in %.1f s (%s)", self.id, self.timings["setup"],
                    ", ".join(f"{n.spec.name}={n.ip}" for n in self._nodes.values()))

    def close(self) -> None:
        """Tear down everything this instance created; idempotent, and safe after a partial start."""
        if self._closed:
            return
        self._closed = True
        began = time.monotonic()
        errors: list[str] = []

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - keep tearing down the rest
                logger.warning("netns cluster %s: %s failed: %s", self.id, what, exc)
                errors.append(f"{what}: {exc}")

        attempt("killing processes", self._kill_all)
        for popen in self._popens:
            with contextlib.suppress(Exception):
                popen.wait(timeout=5)
        for netns in reversed(self._netns_created):
            attempt(f"deleting netns {netns}", _delete_netns, netns)
        for node in self._nodes.values():  # normally gone with their namespace (asynchronously)
            attempt(f"deleting veth {node.host_veth}", _delete_link, node.host_veth)
        if self._bridge_created:
            attempt(f"deleting bridge {self.bridge}", _delete_link, self.bridge)
        for rule in reversed(self._rules):
            attempt(f"deleting iptables rule {rule}", _delete_rule, rule)
        if self._temp_created and self.temp_root.exists():
            attempt("removing temp dir", shutil.rmtree, self.temp_root)
        if self._atexit_registered:
            atexit.unregister(self.close)
        self.timings["teardown"] = time.monotonic() - began
        logger.info("netns cluster %s torn down in %.1f s", self.id, self.timings["teardown"])
        if errors:
            raise NetnsError(f"teardown of netns cluster {self.id} incomplete: {errors}")

    # ---------------------------------------------------------------------------------------------- network

    def _build_network(self) -> None:
        self.temp_root.mkdir(mode=0o755)  # fails on the (unlikely) id clash with another instance: nothing shared
        self._temp_created = True
        self._write_state()
        with _subnet_lock():
            self.subnet = self._choose_subnet()
            hosts = list(self.subnet.hosts())
            self.bridge_ip = str(hosts[0])
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            self._bridge_created = True
            self._write_state()
            _run(["ip", "addr", "add", f"{self.bridge_ip}/{self.subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for index, spec in enumerate(self.specs):
            node = _Node(spec=spec, index=index, netns=f"rgns{self.id}n{index}", ip=str(hosts[9 + index]),
                         host_veth=f"rgv{self.id}n{index}", temp_dir=self.temp_root / spec.name)
            self._nodes[spec.name] = node
            _run(["ip", "netns", "add", node.netns])
            self._netns_created.append(node.netns)
            self._write_state()
            _run(["ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
            _run(["ip", "link", "set", node.host_veth, "master", self.bridge, "up"])
            _run(["ip", "-n", node.netns, "addr", "add", f"{node.ip}/{self.subnet.prefixlen}", "dev", "eth0"])
            _run(["ip", "-n", node.netns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
            _run(["ip", "-n", node.netns, "route", "add", "default", "via", self.bridge_ip])
        self._add_rules()
        self.check_connectivity()

    def _choose_subnet(self) -> ipaddress.IPv4Network:
        used = _used_networks()
        thirds = list(range(1, 255))
        random.shuffle(thirds)
        for third in thirds:
            candidate = ipaddress.ip_network(f"{SUBNET_PREFIX}.{third}.0/24")
            if not any(candidate.overlaps(net) for net in used):
                return candidate
        raise NetnsError(f"no free /24 under {SUBNET_PREFIX}.0.0/16")

    def _add_rules(self) -> None:
        """Let traffic on the bridge through whatever the host's firewall does, and keep it on the bridge."""
        comment = ["-m", "comment", "--comment", self.comment]
        rules = [
            # Bridged node <-> node traffic crosses FORWARD under br_netfilter; Docker's policy there is DROP.
            ["FORWARD", "-i", self.bridge, "-o", self.bridge, *comment, "-j", "ACCEPT"],
            # Nodes may not route anywhere but the bridge (tests reach only these test hosts).
            ["FORWARD", "-i", self.bridge, "!", "-o", self.bridge, *comment, "-j", "DROP"],
            # Host <-> node traffic (driver, `ray job submit`, dashboard) goes through INPUT / OUTPUT.
            ["INPUT", "-i", self.bridge, *comment, "-j", "ACCEPT"],
            ["OUTPUT", "-o", self.bridge, *comment, "-j", "ACCEPT"],
        ]
        for rule in reversed(rules):  # each goes first: the chain then starts with them in this order
            _run(["iptables", "-w", "10", "-I", rule[0], "1", *rule[1:]])
            self._rules.insert(0, rule)
            self._write_state()

    def check_connectivity(self, timeout: float = 15.0, probe_timeout: float = 2.0) -> None:
        """Check TCP from the host to every node and from every node to every other (retrying up to `timeout` s,
        each connection attempt bounded by `probe_timeout` s); raise `NetnsError` naming the failing pairs
        (`"host->IP: ..."`, `"NODE->IP: ..."`). `start` runs it before Ray relies on the network."""
        listeners = []
        try:
            for node in self._nodes.values():
                proc = self.exec(node.spec.name, [sys.executable, "-c", _LISTENER, node.ip, str(_PROBE_PORT),
                                                  str(timeout + 10)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_env())
                listeners.append(proc)
            for proc in listeners:
                line = proc.stdout.readline() if proc.stdout else ""
                if line.strip() != "ready":
                    raise NetnsError(f"probe listener failed: {line!r} {proc.stderr.read() if proc.stderr else ''}")
            deadline = time.monotonic() + timeout
            while True:
                problems = self._probe_all(probe_timeout)
                if not problems:
                    return
                if time.monotonic() > deadline:
                    raise NetnsError(f"no TCP connectivity on bridge {self.bridge}: {problems}")
                time.sleep(0.3)
        finally:
            for proc in listeners:
                proc.kill()
                proc.wait(timeout=5)

    def _probe_all(self, probe_timeout: float) -> list[str]:
        problems: list[str] = []
        ips = [node.ip for node in self._nodes.values()]
        for ip in ips:
            try:
                with socket.create_connection((ip, _PROBE_PORT), timeout=probe_timeout) as conn:
                    if conn.recv(2) != b"ok":
                        problems.append(f"host->{ip}: bad reply")
            except OSError as exc:
                problems.append(f"host->{ip}: {exc!r}")
        if len(ips) > 1:
            probers = {name: self.exec(name, [sys.executable, "-c", _PROBER, str(probe_timeout), str(_PROBE_PORT),
                                              *[ip for ip in ips if ip != node.ip]],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_env())
                       for name, node in self._nodes.items()}
            for name, proc in probers.items():
                out, err = proc.communicate(timeout=_CMD_TIMEOUT)
                try:
                    results = json.loads(out)
                except json.JSONDecodeError:
                    problems.append(f"{name}: prober failed: {err.strip()}")
                    continue
                problems += [f"{name}->{ip}: {res}" for ip, res in results.items() if res is not True]
        return problems

    # ---------------------------------------------------------------------------------------------- Ray

    def _ray_env(self) -> dict[str, str]:
        env = _clean_env()
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0"})
        # `python` in job entrypoints and node-side commands is this interpreter (as if its venv were active).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
        # Every node and driver imports this checkout's raygrpo, not whatever the interpreter has installed.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
        return env

    def env(self, address: str | None = None) -> dict[str, str]:
        """The environment a client in the host's namespace uses: the token auth variables, and `RAY_ADDRESS` set
        to `address` (default `dashboard_url`, for the job API; pass `gcs_address` for `ray.init()`)."""
        env = self._ray_env()
        env["RAY_ADDRESS"] = address if address is not None else self.dashboard_url
        return env

    def _start_ray(self) -> None:
        ray = _ray_bin()
        if ray is None:
            raise NetnsError("the `ray` command is not installed")
        head = self._nodes[self.specs[0].name]
        self.gcs_address = f"{head.ip}:{self.gcs_port}"
        self.dashboard_url = f"http://{head.ip}:{self.dashboard_port}"
        self.client_address = f"ray://{head.ip}:{self.client_port}"
        head_argv = [ray, "start", "--head", "--port", str(self.gcs_port), "--dashboard-host", "0.0.0.0",
                     "--include-dashboard", "true", "--dashboard-port", str(self.dashboard_port),
                     "--ray-client-server-port", str(self.client_port)]
        if self.system_config:
            head_argv += ["--system-config", json.dumps(self.system_config)]
        deadline = time.monotonic() + self.start_timeout
        head_began = time.monotonic()
        self._ray_start(head, head_argv, deadline)
        self.timings["ray_head"] = time.monotonic() - head_began
        workers = [self._nodes[spec.name] for spec in self.specs[1:]]
        procs = [(node, self._ray_start_popen(node, [ray, "start", "--address", self.gcs_address])) for node in workers]
        for node, proc in procs:
            self._ray_start_wait(node, proc, deadline)
        self.timings["ray_workers"] = time.monotonic() - head_began - self.timings["ray_head"]
        self.wait_for_nodes(len(self.specs), timeout=max(5.0, deadline - time.monotonic()))
        self._wait_dashboard(deadline)

    def _node_args(self, node: _Node) -> list[str]:
        spec = node.spec
        argv = ["--node-ip-address", node.ip, "--node-name", spec.name, "--num-cpus", str(spec.num_cpus),
                "--resources", json.dumps(dict(spec.resources)), "--object-store-memory",
                str(spec.object_store_memory), "--temp-dir", str(node.temp_dir), "--disable-usage-stats"]
        if spec.labels:
            argv += ["--labels", json.dumps(dict(spec.labels))]
        return argv

    def _ray_start_popen(self, node: _Node, argv: list[str]) -> subprocess.Popen[Any]:
        log = open(self.temp_root / f"{node.spec.name}.start.log", "w")  # noqa: SIM115 - closed with the Popen
        with log:
            return self.exec(node.spec.name, [*argv, *self._node_args(node)], stdout=log, stderr=subprocess.STDOUT,
                             env={**self._ray_env(), **node.spec.env})

    def _ray_start(self, node: _Node, argv: list[str], deadline: float) -> None:
        self._ray_start_wait(node, self._ray_start_popen(node, argv), deadline)

    def _ray_start_wait(self, node: _Node, proc: subprocess.Popen[Any], deadline: float) -> None:
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            raise NetnsError(f"`ray start` on {node.spec.name} timed out\n{self.log_tail(node.spec.name)}") from None
        if code != 0:
            raise NetnsError(f"`ray start` on {node.spec.name} exited {code}\n{self.log_tail(node.spec.name)}")

    def _wait_dashboard(self, deadline: float) -> None:
        """Until the head's dashboard (job API) answers HTTP from the host's namespace."""
        request = urllib.request.Request(f"{self.dashboard_url}/api/version",
                                         headers={"Authorization": f"Bearer {self.token}"})
        last: object = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # it answers: up (whatever it thinks of the request)
            except OSError as exc:
                last = exc
            time.sleep(0.5)
        raise NetnsError(f"dashboard {self.dashboard_url} did not answer: {last!r}\n{self.log_tail(self.specs[0].name)}")

    def nodes(self, want_alive: int = 0, timeout: float = 30.0, exact: bool = False) -> list[dict[str, Any]]:
        """Ray's node table as the GCS reports it (id, ip, name, alive, head, resources), read from a subprocess in
        the host's namespace (no driver connects). With `want_alive`, poll up to `timeout` s until at least (with
        `exact`: exactly) that many are alive, and return what it last saw."""
        done = _run([sys.executable, "-c", _NODES, self.gcs_address, str(want_alive), str(timeout),
                     "exact" if exact else "atleast"], timeout=timeout + 60, env=self._ray_env())
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if result["error"] and not result["nodes"]:
            raise NetnsError(f"cannot read the node table from {self.gcs_address}: {result['error']}")
        return result["nodes"]

    def wait_for_nodes(self, count: int, timeout: float = 60.0, exact: bool = False) -> list[dict[str, Any]]:
        """Until at least (with `exact`: exactly) `count` nodes are alive; returns the alive ones. Raises with the
        tail of every node's logs when they are not in time."""
        nodes = self.nodes(want_alive=count, timeout=timeout, exact=exact)
        alive = [n for n in nodes if n["alive"]]
        if len(alive) < count or (exact and len(alive) != count):
            tails = "\n".join(self.log_tail(name) for name in self._nodes)
            raise NetnsError(f"{len(alive)} of {count} nodes alive after {timeout:.0f} s: "
                             f"{[(n['ip'], n['alive']) for n in nodes]}\n{tails}")
        return alive

    def log_tail(self, node: str, lines: int = 20) -> str:
        """The last lines of a node's `ray start` output and of its Ray logs (raylet, GCS, dashboard)."""
        n = self._nodes[node]
        files = [self.temp_root / f"{node}.start.log"]
        logs = n.temp_dir / "session_latest" / "logs"
        for pattern in ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err", "dashboard.log",
                        "dashboard.err"):
            files += sorted(logs.glob(pattern))
        parts = []
        for path in files:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(text))
        return f"=== logs of node {node} ===\n" + ("\n".join(parts) or "(none)")

    # ---------------------------------------------------------------------------------------------- helpers

    @property
    def node_names(self) -> list[str]:
        """The node names, head first."""
        return [spec.name for spec in self.specs]

    @property
    def namespaces(self) -> list[str]:
        """The names of the network namespaces this instance created (for `ip netns exec`)."""
        return list(self._netns_created)

    @property
    def links(self) -> list[str]:
        """The host-side links this instance creates: the bridge, then one veth end per node."""
        return [self.bridge, *(node.host_veth for node in self._nodes.values())]

    @property
    def rules(self) -> list[list[str]]:
        """The iptables rules this instance inserted (chain first, as `iptables -D` takes them)."""
        return [list(rule) for rule in self._rules]

    def node_ip(self, node: str) -> str:
        """A node's IP address on the bridge."""
        return self._nodes[node].ip

    def namespace(self, node: str) -> str:
        """The name of a node's network namespace (for `ip netns exec`)."""
        return self._nodes[node].netns

    def exec(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start a command in a node's namespace (`ip netns exec`); `popen_kwargs` go to `subprocess.Popen`. Without
        `env`, it gets the cluster's token env with `RAY_ADDRESS` = the GCS address. Teardown kills it if it runs."""
        popen_kwargs.setdefault("env", self.env(self.gcs_address) if self.gcs_address else self._ray_env())
        proc = subprocess.Popen(["ip", "netns", "exec", self._nodes[node].netns, *argv], **popen_kwargs)
        self._popens.append(proc)
        return proc

    def run(self, node: str, argv: Sequence[str], timeout: float = 120.0,
            **run_kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command in a node's namespace to completion (text output captured unless told otherwise)."""
        run_kwargs.setdefault("env", self.env(self.gcs_address) if self.gcs_address else self._ray_env())
        run_kwargs.setdefault("capture_output", True)
        run_kwargs.setdefault("text", True)
        check = run_kwargs.pop("check", False)
        return subprocess.run(["ip", "netns", "exec", self._nodes[node].netns, *argv], check=check, timeout=timeout,
                              **run_kwargs)

    def run_driver(self, script: str, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        """Run a Python driver script in the host's namespace with `env(gcs_address)` (so `ray.init()` joins)."""
        return subprocess.run([sys.executable, "-c", script, *args], env=self.env(self.gcs_address), check=False,
                              capture_output=True, text=True, timeout=timeout)

    def pids(self, node: str | None = None) -> list[int]:
        """The processes living in one node's namespace, or in all of them."""
        names = [node] if node is not None else list(self._nodes)
        return [pid for name in names for pid in namespace_pids(self._nodes[name].netns)]

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL every process in a node's namespace (the host is lost); returns their pids."""
        killed = _kill_pids_in([self._nodes[node].netns], grace=None)
        self.killed.update(killed)
        logger.info("netns cluster %s: killed node %s (%d processes)", self.id, node, len(killed))
        return sorted(killed)

    def restart_node(self, node: str, timeout: float = 120.0) -> None:
        """`ray start` a killed worker node again (the host came back): it joins the cluster as a new node, with its
        namespace, address, resources and environment as before; returns once Ray counts every node alive."""
        node_ = self._nodes[node]
        if node == self.specs[0].name:
            raise NetnsError("the head cannot be restarted")
        ray = _ray_bin()
        if ray is None:
            raise NetnsError("the `ray` command is not installed")
        self._ray_start(node_, [ray, "start", "--address", self.gcs_address], time.monotonic() + timeout)
        self.wait_for_nodes(len(self.specs), timeout=timeout)
        logger.info("netns cluster %s: restarted node %s", self.id, node)

    def partition(self, node: str) -> None:
        """Cut a node off the bridge (its veth link down): a network partition."""
        _run(["ip", "link", "set", self._nodes[node].host_veth, "down"])
        logger.info("netns cluster %s: partitioned %s", self.id, node)

    def heal(self, node: str) -> None:
        """Reconnect a partitioned node (its veth link up)."""
        _run(["ip", "link", "set", self._nodes[node].host_veth, "up"])
        logger.info("netns cluster %s: healed %s", self.id, node)

    def _drop_rules(self, node: str, peer: str) -> list[list[str]]:
        ip = self._nodes[peer].ip
        return [["INPUT", "-s", ip, "-j", "DROP"], ["OUTPUT", "-d", ip, "-j", "DROP"]]

    def drop(self, node: str, peer: str | None = None) -> None:
        """Drop every packet between a node and `peer` (default: the head), both ways, with iptables rules in the
        node's own namespace: silent loss, as a cut cable or a black-holing switch, with the links up. The rules go
        with the namespace at teardown."""
        peer = peer or self.specs[0].name
        for rule in self._drop_rules(node, peer):
            _run(["ip", "netns", "exec", self._nodes[node].netns, "iptables", "-w", "5", "-I", *rule])
        logger.info("netns cluster %s: dropping packets between %s and %s", self.id, node, peer)

    def undrop(self, node: str, peer: str | None = None) -> None:
        """Remove the rules of `drop`."""
        peer = peer or self.specs[0].name
        for rule in self._drop_rules(node, peer):
            _run(["ip", "netns", "exec", self._nodes[node].netns, "iptables", "-w", "5", "-D", *rule])
        logger.info("netns cluster %s: packets flow again between %s and %s", self.id, node, peer)

    def _kill_all(self) -> None:
        self.killed.update(_kill_pids_in(self._netns_created, grace=self.kill_grace))

    # ---------------------------------------------------------------------------------------------- leftovers

    def resources_left(self) -> list[str]:
        """What of this instance still exists on the machine (namespaces, links, rules, dirs, processes)."""
        left: list[str] = []
        existing_ns = set(_netns_names())
        left += [f"netns {ns}" for ns in self._netns_created if ns in existing_ns]
        for name in [self.bridge, *(node.host_veth for node in self._nodes.values())]:
            if Path(f"/sys/class/net/{name}").exists():
                left.append(f"link {name}")
        left += [f"iptables {line}" for line in _iptables_lines() if self.comment in line]
        if self.temp_root.exists():
            left.append(f"dir {self.temp_root}")
        left += [f"process {pid}" for pid, start in self.killed.items() if process_alive(pid, start)]
        left += [f"process {pid} in {ns}" for ns in self._netns_created for pid in namespace_pids(ns)]
        return left

    def _write_state(self) -> None:
        """Record what exists so far, so `reap_stale` can remove it if this process dies without tearing down."""
        state = {"owner_pid": os.getpid(), "owner_start": proc_start_ticks(os.getpid()), "bridge": self.bridge,
                 "bridge_created": self._bridge_created, "netns": self._netns_created, "rules": self._rules,
                 "veths": [node.host_veth for node in self._nodes.values()]}
        tmp = self.temp_root / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.temp_root / "state.json")


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in STRIPPED_ENV:
        env.pop(key, None)
    return env


def _delete_link(name: str, timeout: float = 5.0) -> None:
    """Delete a network link if it exists (a veth goes away by itself, a moment after its namespace)."""
    deadline = time.monotonic() + timeout
    while Path(f"/sys/class/net/{name}").exists():
        done = _run(["ip", "link", "delete", name], check=False)
        if done.returncode != 0 and time.monotonic() > deadline:
            raise NetnsError(f"cannot delete link {name}: {done.stderr.strip()}")
        time.sleep(0.05)


def _delete_netns(name: str) -> None:
    """Delete a named network namespace if it exists."""
    if Path(f"/run/netns/{name}").exists():
        _run(["ip", "netns", "delete", name])


def _delete_rule(rule: Sequence[str]) -> None:
    """Delete an iptables rule (chain first, as inserted) if it is there."""
    if _run(["iptables", "-w", "10", "-C", *rule], check=False).returncode == 0:
        _run(["iptables", "-w", "10", "-D", *rule])


def _netns_names() -> list[str]:
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _iptables_lines() -> list[str]:
    lines: list[str] = []
    for chain in ("FORWARD", "INPUT", "OUTPUT"):
        lines += _run(["iptables", "-w", "10", "-S", chain], check=False).stdout.splitlines()
    return lines


def reap_stale() -> list[str]:
    """Remove the leftovers of harness instances whose owning process has died without tearing down (a run killed
    by SIGKILL or a hard timeout); returns the ids reaped. Live instances are never touched."""
    reaped: list[str] = []
    for state_file in TEMP_ROOT.glob(f"{TEMP_PREFIX}*/state.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if process_alive(state["owner_pid"], state.get("owner_start")):
            continue
        instance = state_file.parent.name.removeprefix(TEMP_PREFIX)
        logger.warning("reaping netns cluster %s left by dead process %s", instance, state["owner_pid"])
        with contextlib.suppress(NetnsError):
            _kill_pids_in(state["netns"], grace=1.0)
        for netns in state["netns"]:
            with contextlib.suppress(NetnsError, subprocess.SubprocessError):
                _delete_netns(netns)
        for link in [*state["veths"], state["bridge"]]:
            with contextlib.suppress(NetnsError, subprocess.SubprocessError):
                _delete_link(link)
        for rule in state["rules"]:
            with contextlib.suppress(NetnsError, subprocess.SubprocessError):
                _delete_rule(rule)
        shutil.rmtree(state_file.parent, ignore_errors=True)
        reaped.append(instance)
    return reaped
