"""CPU seconds of a benchmark's driver and every process of its Ray session, sampled from outside raygrpo (psutil).

Shared by the benchmarks that state raygrpo's CPU per rollout (`cluster_scale.py`, `provisioning.py`): the driver
process and all its descendants (Ray's GCS, raylets, agents and workers started by `ray.init()` or
`ray.cluster_utils.Cluster`) are counted, so work moved from one process to another is not counted as saved.
Processes that live less than a sampling interval (a sandbox's commands) are not seen.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any


class SessionCpu:
    """CPU seconds (user + system) of this process and all its descendants (the Ray session's processes), except
    the excluded pids and their children.

    Every process ever seen keeps its last sampled CPU, so one that exits (a removed node's raylet, a worker that
    finished) still counts up to its last sample; a background thread samples every `interval_s` and the time that
    thread (and every explicit `sample` call) spends is subtracted from the total.

    Args:
        exclude: Pids left out with their children (the fake provider).
        interval_s: Background sampling period.
    """

    def __init__(self, exclude: set[int], interval_s: float = 1.0) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process()
        self.exclude = set(exclude)
        self.interval_s = interval_s
        self._seen: dict[tuple[int, float], float] = {}
        self._names: dict[tuple[int, float], str] = {}
        self._raw: dict[tuple[int, float], str] = {}
        #: The last total (sampling overhead excluded), for progress lines.
        self.latest = 0.0
        self._procs: dict[int, Any] = {}
        self._overhead = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def _refresh(self) -> float:
        psutil = self._psutil
        try:
            children = self.root.children(recursive=True)
        except psutil.Error:
            children = []
        alive = {p.pid for p in children}
        for pid in list(self._procs):
            if pid not in alive:
                del self._procs[pid]
        for proc in [self.root, *children]:
            cached = self._procs.setdefault(proc.pid, proc)  # a kept Process object is cheaper to read again
            try:
                with cached.oneshot():
                    if cached.pid in self.exclude or cached.ppid() in self.exclude:
                        continue
                    key = (cached.pid, cached.create_time())
                    times = cached.cpu_times()
                    self._seen[key] = times.user + times.system
                    raw = cached.name()
                    if self._raw.get(key) != raw:  # a Ray worker renames itself once it knows what it runs
                        self._raw[key] = raw
                        self._names[key] = process_kind(cached)
            except psutil.Error:
                self._procs.pop(proc.pid, None)
        return sum(self._seen.values())

    def sample(self) -> float:
        """raygrpo's CPU seconds so far (sampling overhead excluded)."""
        began = time.thread_time()
        with self._lock:
            total = self._refresh()
            self._overhead += time.thread_time() - began
            self.latest = total - self._overhead
            return self.latest

    def by_kind(self) -> dict[str, float]:
        """CPU seconds so far per kind of process (driver, gcs, raylet, env pool actor, ...)."""
        with self._lock:
            out: Counter[str] = Counter()
            for key, cpu in self._seen.items():
                out[self._names.get(key, "other")] += cpu
            out["driver"] -= self._overhead
            return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> SessionCpu:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)


def process_kind(proc: Any) -> str:
    """A short name for a Ray session process: driver, gcs_server, raylet, an env pool actor, a Ray agent, ..."""
    if proc.pid == os.getpid():
        return "driver"
    try:
        cmdline = " ".join(proc.cmdline())
        name = proc.name()
    except Exception:  # noqa: BLE001 - gone meanwhile
        return "other"
    if "gcs_server" in name or "gcs_server" in cmdline:
        return "gcs_server"
    if name == "raylet" or "/raylet" in cmdline.split(" ")[0]:
        return "raylet"
    for agent in ("dashboard_agent", "runtime_env_agent", "log_monitor", "monitor.py", "dashboard.py"):
        if agent in cmdline:
            return agent.removesuffix(".py")
    if name.startswith("ray::"):
        return name.split(".")[0]  # ray::EnvPool, ray::GovernorActor (its title names the method it runs), ray::IDLE
    return name or "other"
