"""The local sandbox's network (`raygrpo.sandbox.local`): a namespace of its own, never the host's.

A policy under training is untrusted code rewarded for whatever works, and every service of the host that a sandbox
could reach is a way out of it: Ray's dashboard agent runs jobs on the host, the GCS, raygrpo's own servers, the
wheelhouse, any local service of the user. So every sandbox gets a network namespace of its own (bwrap's
`--unshare-net`), with its own loopback, and what else it gets follows the task's network mode:

- `no-network`: nothing else. Loopback only.
- `public` (Harbor's default): outbound access through slirp4netns, a user-space TCP/IP stack (Debian package
  `slirp4netns`) that opens the sandbox's connections as ordinary sockets of the host. Its `--disable-host-loopback`
  refuses the host's 127.0.0.0/8, and a firewall inside the sandbox's namespace (installed by the host before any
  command runs; the commands lack `CAP_NET_ADMIN` to change it) rejects every address the host had when the
  sandbox started (its interfaces, docker's bridges, test hosts' bridges), the link-local range (cloud metadata
  services live at 169.254.169.254) and slirp's own alias for the host. What stays reachable is what lies beyond
  the host.
- `allowlist`: refused (Harbor's own check, by name): slirp4netns cannot filter by host name.

Limits, said plainly: an address the host gains after a sandbox started (a docker network made later) is not in
that sandbox's firewall; IPv6 is not offered at all (slirp4netns runs without `--enable-ipv6`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import socket
from pathlib import Path

from raygrpo.sandbox.errors import SandboxStartError
from raygrpo.sandbox.process import NSENTER, log_tail, read_pipe

SLIRP4NETNS = shutil.which("slirp4netns") or "/usr/bin/slirp4netns"
IPTABLES_RESTORE = shutil.which("iptables-restore") or "/usr/sbin/iptables-restore"
#: slirp4netns's address for the host (its gateway); with `--disable-host-loopback` it answers nothing, and the
#: firewall rejects it as well.
SLIRP_HOST_ALIAS = "10.0.2.2"
#: Never reachable from a sandbox: link-local, where cloud providers serve instance metadata and credentials.
ALWAYS_BLOCKED = ("169.254.0.0/16", SLIRP_HOST_ALIAS)
#: How long slirp4netns may take to configure the sandbox's interface.
READY_TIMEOUT_S = 10.0


def host_addresses() -> list[str]:
    """Every IPv4 address on this host's interfaces now (loopback aside: slirp4netns refuses that range itself)."""
    import psutil

    found: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not ipaddress.ip_address(addr.address).is_loopback:
                found.add(addr.address)
    return sorted(found, key=ipaddress.ip_address)


def firewall_rules(blocked: list[str]) -> str:
    """`iptables-restore` input for a sandbox's namespace: reject (fast, not a silent drop) every destination in
    `blocked`, TCP with a reset, the rest with an ICMP error."""
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]"]
    for dest in blocked:
        lines.append(f"-A OUTPUT -d {dest} -p tcp -j REJECT --reject-with tcp-reset")
        lines.append(f"-A OUTPUT -d {dest} -j REJECT --reject-with icmp-port-unreachable")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def missing_tools() -> list[str]:
    """The host tools a sandbox with outbound access needs and this host lacks."""
    return [tool for tool in (SLIRP4NETNS, IPTABLES_RESTORE) if not os.access(tool, os.X_OK)]


class OutboundNetwork:
    """A sandbox's outbound access: its slirp4netns process and the firewall in its namespace.

    `start(init_pid)` installs the firewall, then attaches slirp4netns to the namespace of `init_pid` and waits
    until the interface is up. `stop()` ends slirp4netns. slirp4netns also ends by itself when this process dies,
    even by SIGKILL: it watches a pipe whose only writer is this process (`--exit-fd`).
    """

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self._exit_w: int | None = None

    async def start(self, init_pid: int, log_path: Path, env: dict[str, str]) -> None:
        """slirp4netns and the firewall, for the namespace of `init_pid`; slirp4netns runs with `env` (the
        sandbox's mark, so that the sandbox's own clean-up and the reapers find it as one of its processes).

        Raises:
            SandboxStartError: a tool is missing, the firewall could not be installed, or slirp4netns did not
                configure the interface within `READY_TIMEOUT_S`.
        """
        missing = missing_tools()
        if missing:
            raise SandboxStartError(
                f"a sandbox whose task allows the network needs {', '.join(missing)} (Debian: apt-get install "
                "slirp4netns iptables); give the task `network_mode = \"no-network\"` to run it without"
            )
        ready_r, ready_w = os.pipe()
        exit_r, self._exit_w = os.pipe()
        os.set_inheritable(self._exit_w, False)
        # Not --enable-sandbox: run as root where the host's mounts are shared (`ip netns add` makes /run/netns
        # so), its detaching of the old root propagates and unmounts the host's network namespaces.
        argv = [SLIRP4NETNS, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-seccomp",
                f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", str(init_pid), "tap0"]
        try:
            with open(log_path, "ab") as log:
                self.proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(ready_w, exit_r),
                    env=env, start_new_session=True,
                )
        finally:
            os.close(ready_w)
            os.close(exit_r)
        ready_task = read_pipe(ready_r, nbytes=1)
        try:
            # While slirp4netns configures the interface: no command of the sandbox runs before both are done.
            await self._install_firewall(init_pid, [*host_addresses(), *ALWAYS_BLOCKED])
            try:
                ready = await asyncio.wait_for(ready_task, READY_TIMEOUT_S)
            except TimeoutError:
                ready = b""
            if ready != b"1":
                raise SandboxStartError("slirp4netns did not bring up the sandbox's network: "
                                        f"{log_tail(log_path) or '(no output)'}")
        except BaseException:
            ready_task.cancel()
            await self.stop()
            raise

    async def stop(self) -> None:
        """End slirp4netns (closing its exit pipe; SIGKILL if it lingers). Idempotent."""
        if self._exit_w is not None:
            os.close(self._exit_w)
            self._exit_w = None
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=2.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()

    @staticmethod
    async def _install_firewall(init_pid: int, blocked: list[str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            NSENTER, "-t", str(init_pid), "-n", "--", IPTABLES_RESTORE,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate(firewall_rules(blocked).encode())
        if proc.returncode != 0:
            raise SandboxStartError(
                f"could not install the sandbox's firewall (iptables-restore exit {proc.returncode}): "
                f"{out.decode(errors='replace').strip()[-500:]}"
            )

