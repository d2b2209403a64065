"""Stopping a Ray cluster that a test started, by pid: never a machine-wide `ray stop`, which would kill every other
Ray on the machine (other tests', other people's).

Every process of a cluster started with its own `--temp-dir` names that dir (or its session dir under it) on its
command line: the head's services, the raylets and agents of nodes started later (e.g. by an autoscaler), and the
workers. `stop_cluster` stops the `ray start --block` process group, then kills whatever still names the dir.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from pathlib import Path

import psutil


def processes_naming(marker: str | Path) -> list[psutil.Process]:
    """Running processes whose command line contains `marker`."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(marker) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop_cluster(proc: subprocess.Popen | None, marker: str | Path, grace_s: float = 30.0,
                 rounds: int = 1) -> list[psutil.Process]:
    """SIGTERM `proc` (a `ray start --block` started with `start_new_session=True`) and wait up to `grace_s`, SIGKILL
    every process that names `marker` (looking `rounds` times: a process that is still starting nodes may add some),
    then SIGKILL its process group. Returns the processes still naming `marker` afterwards.

    Only `ray start` itself gets the SIGTERM: it drains its node through the GCS and stops its processes (~2 s). A
    SIGTERM to the whole group stops the GCS first, and the drain then waits 30 s for it."""
    if proc is not None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    for _ in range(rounds):
        mine = processes_naming(marker)
        if not mine:
            break
        for p in mine:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(mine, timeout=15)
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return processes_naming(marker)


#: Ports below the kernel's ephemeral range (outgoing connections take theirs there, so a port found free there can
#: be taken by a connection before the server binds it) and above Ray's worker ports (10002-19999 by default).
_LISTEN_RANGE = (20000, 32000)


def listen_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that nothing holds now, for a server started next (`ray start`'s
    `--port`, `--dashboard-port`, agents). Picked at random outside the ephemeral range: a port from `bind(0)` lies
    inside it, where the many client connections of a Ray already running on the machine may take it first."""
    picked: list[int] = []
    while len(picked) < n:
        port = random.randint(*_LISTEN_RANGE)
        if port in picked:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(port)
    return picked
