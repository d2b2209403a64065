"""The node's firewall against its docker sandboxes: a rollout's container reaches nothing of the node it runs on.

Containers on a bridge network reach every address of their host through the bridge: the gateway address, the
node's own address (where a cluster's Ray dashboard agent and GCS listen), the wheelhouse that docker builds use.
Every docker sandbox raygrpo starts puts its compose project's default network on a bridge named `rg-<12 hex>`
(`bridge_name`, set in raygrpo's compose file), and one chain of the host's `iptables` guards them all:

    INPUT   -i rg-+ -j RAYGRPO-SANDBOX       (connections from a sandbox to any address of the host: rejected)
    FORWARD -i rg-+ -d 169.254.0.0/16 -j RAYGRPO-SANDBOX   (link-local: cloud metadata services)

Connections beyond the host (a `public` task's downloads) pass; docker builds run on docker's default bridge
(`docker0`), not on `rg-` bridges, so they still reach the wheelhouse. The chain is installed once per node by the
first docker sandbox that starts there (root and `iptables` needed; a start fails saying so otherwise) and stays:
it matches only raygrpo's bridges. `python -m raygrpo.docker.guard remove` takes it out
(`scripts/docker-dev.sh stop` does), `status` says whether it is in place.

Where the env pool actors cannot change the firewall themselves (a Ray container without root, or without
`CAP_NET_ADMIN` in the network namespace the sandboxes' bridges live in), the node's set-up installs the chain
(`sudo python -m raygrpo.docker.guard install`, as the cluster files do) and says so with
`RAYGRPO_DOCKER_GUARD=external`; sandboxes then start without checking it.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import threading

from raygrpo.core.scratch import shared_tempdir

CHAIN = "RAYGRPO-SANDBOX"
BRIDGE_PREFIX = "rg-"
#: The docker network option that names a bridge network's interface on the host.
BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
#: Where the host's chain hooks in: (built-in chain, match) for traffic coming from a sandbox's bridge.
HOOKS = (
    ("INPUT", ["-i", f"{BRIDGE_PREFIX}+"]),
    ("FORWARD", ["-i", f"{BRIDGE_PREFIX}+", "-d", "169.254.0.0/16"]),
)
#: The chain itself: replies to connections the host opened pass; everything else is refused at once.
RULES = (
    ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
    ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
    ["-j", "REJECT", "--reject-with", "icmp-port-unreachable"],
)
#: The node-wide lock's file name, in the temp dir the node's processes share (`shared_tempdir`).
_LOCK_NAME = "raygrpo-docker-guard.lock"
#: `auto` (the default): the first sandbox installs the chain; `external`: the node's set-up did.
MODE_ENV = "RAYGRPO_DOCKER_GUARD"
MODES = ("auto", "external")
_ensured = threading.Event()


class GuardError(RuntimeError):
    """The host's firewall rules for docker sandboxes could not be installed."""


def bridge_name(session_id: str) -> str:
    """The host interface name of a sandbox's bridge network (15 characters, Linux's limit)."""
    return BRIDGE_PREFIX + hashlib.sha1(session_id.encode()).hexdigest()[:12]


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    tool = shutil.which("iptables")
    if tool is None:
        raise GuardError("docker sandboxes need iptables on the node to keep them from reaching its services "
                         "(Debian: apt-get install iptables)")
    done = subprocess.run([tool, "-w", *args], capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise GuardError(f"iptables {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _hooked(chain: str, match: list[str]) -> bool:
    return _iptables("-C", chain, *match, "-j", CHAIN, check=False).returncode == 0


def installed() -> bool:
    """Whether the chain holds exactly `RULES` and both hooks are in place."""
    listed = _iptables("-S", CHAIN, check=False)
    if listed.returncode != 0:
        return False
    count = sum(line.startswith(f"-A {CHAIN} ") for line in listed.stdout.splitlines())
    return (
        count == len(RULES)
        and all(_iptables("-C", CHAIN, *rule, check=False).returncode == 0 for rule in RULES)
        and all(_hooked(chain, match) for chain, match in HOOKS)
    )


def ensure() -> None:
    """Install the chain and its hooks unless they are in place (once per process; blocking: call it off the event
    loop). Several processes of one node may call it at once: a file lock orders them.

    Raises:
        GuardError: not root, no iptables, or iptables refused.
    """
    if _ensured.is_set():
        return
    mode = os.environ.get(MODE_ENV, "auto")
    if mode not in MODES:
        raise GuardError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "external":
        _ensured.set()
        return
    if os.geteuid() != 0:
        raise GuardError("docker sandboxes need the node's firewall rules (raygrpo.docker.guard), which "
                         "only root can install: run `python -m raygrpo.docker.guard install` as root once "
                         f"per node and set {MODE_ENV}=external")
    with open(shared_tempdir() / _LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed():
            if _iptables("-S", CHAIN, check=False).returncode != 0:
                _iptables("-N", CHAIN)
            _iptables("-F", CHAIN)
            for rule in RULES:
                _iptables("-A", CHAIN, *rule)
            for chain, match in HOOKS:
                if not _hooked(chain, match):
                    _iptables("-I", chain, "1", *match, "-j", CHAIN)
    _ensured.set()


def shell_script() -> str:
    """What `ensure` installs, as one POSIX shell command line (`iptables` only: for a node's set-up where raygrpo
    is not installed, such as the KubeRay manifests' Docker sidecar). Idempotent, as `ensure` is."""
    lines = [f"(iptables -w -N {CHAIN} 2>/dev/null || true)", f"iptables -w -F {CHAIN}"]
    lines += [f"iptables -w -A {CHAIN} {' '.join(rule)}" for rule in RULES]
    for chain, match in HOOKS:
        hook = f"{chain} {' '.join(match)} -j {CHAIN}"
        lines.append(f"(iptables -w -C {hook} 2>/dev/null || iptables -w -I {chain} 1 {' '.join(match)} -j {CHAIN})")
    return " && ".join(lines)


def remove() -> None:
    """Take the hooks and the chain out (what is not there is skipped)."""
    for chain, match in HOOKS:
        while _hooked(chain, match):
            _iptables("-D", chain, *match, "-j", CHAIN)
    if _iptables("-S", CHAIN, check=False).returncode == 0:
        _iptables("-F", CHAIN)
        _iptables("-X", CHAIN)
    _ensured.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raygrpo.docker.guard", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["install", "remove", "status", "shell"],
                        help="shell: print the iptables commands of `install`, for a node without raygrpo")
    action = parser.parse_args(argv).action
    if action == "shell":
        print(shell_script())
        return 0
    try:
        if action == "install":
            ensure()
        elif action == "remove":
            remove()
    except GuardError as exc:
        print(f"error: {exc}")
        return 1
    state = installed()
    print(f"{CHAIN}: {'installed' if state else 'not installed'}")
    return 0 if state or action == "remove" else 1


if __name__ == "__main__":
    raise SystemExit(main())
