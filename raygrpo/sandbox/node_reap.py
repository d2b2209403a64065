"""One node's part of cleaning up: reap what crashed runs left on this machine, and count what a run left.

Sandbox folders and docker engines are node-local, so each of these runs on the node it is about: in-process on a
single machine, or as a Ray task pinned to each node of a cluster (`raygrpo.driver.node_tasks`).

- `reap_node`: the local sandboxes of every run whose owner is gone under the node's sandbox root
  (`raygrpo.sandbox.run_folders.reap_base`: folders, processes and with them their mounts, emptied run folders) and
  the docker sandboxes on this host whose owner died (`raygrpo.docker.owners.reap_docker_orphans`). What
  `raygrpo reap` and every env pool actor's start-up run.
- `run_leftovers_here`: at the end of a run, its orphans on this node reaped, then what of it is still alive here
  (local sandboxes, docker projects labelled with the run); its emptied folder removed. The run's `leaked_envs`
  adds these up over the nodes.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import asdict, dataclass, field

from raygrpo.docker.engine import DockerUnavailable, may_have_docker
from raygrpo.docker.owners import reap_docker_orphans, run_leftovers
from raygrpo.sandbox.owners import live_sandboxes
from raygrpo.sandbox.run_folders import BaseReap, base_root, reap_base, remove_if_empty

logger = logging.getLogger(__name__)


def node_address() -> str:
    """This node's address as Ray names it when Ray runs here, else the host name."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - not a Ray process: the host name will do
        pass
    return socket.gethostname()


@dataclass
class NodeReap:
    """What `reap_node` removed on one node.

    Args:
        node: The node's address.
        local: The local sandboxes, processes and run folders removed under its sandbox root.
        docker: Docker sandboxes (compose projects) removed.
        docker_error: Why docker could not be asked, when it could not.
    """

    node: str
    local: BaseReap
    docker: list[str] = field(default_factory=list)
    docker_error: str | None = None

    def lines(self) -> list[str]:
        """A line per thing removed, each naming the node."""
        out = [f"{self.node}: {line}" for line in self.local.lines()]
        out += [f"{self.node}: removed docker sandbox {p} (its owner is gone)" for p in self.docker]
        if self.docker_error:
            out.append(f"{self.node}: docker not reaped: {self.docker_error}")
        return out

    def to_dict(self) -> dict:
        return {"node": self.node, **self.local.to_dict(), "docker": self.docker, "docker_error": self.docker_error}


def reap_node(root: str | os.PathLike | None = None, stale_after_s: float = 60.0,
              run: str | None = None) -> NodeReap:
    """Reap this node's leftovers of crashed runs, local and docker (see the module docstring); never a live run's.

    Args:
        root: The sandbox root (default: `$RAYGRPO_SANDBOX_ROOT`, else `/tmp/raygrpo-sandboxes`).
        stale_after_s: A local sandbox whose heartbeat is older than this is orphaned even when its owner pid looks
            alive.
        run: Only this run's local sandboxes (its folder; docker ones are reaped by owner, whatever their run).
    """
    report = NodeReap(node_address(), reap_base(root, stale_after_s, only_run=run))
    if may_have_docker():
        try:
            report.docker = reap_docker_orphans()
        except DockerUnavailable as exc:
            report.docker_error = str(exc)
    return report


@dataclass
class RunLeftovers:
    """What of one run is still alive on one node after it ended.

    Args:
        node: The node's address.
        sandboxes: Ids of the run's local sandboxes still there (their owner alive, or not reapable).
        docker: The run's docker sandboxes (compose projects) docker still has.
        reaped: The run's orphaned sandboxes reaped here first.
        folder_removed: Whether the run's (then empty) folder was removed.
    """

    node: str
    sandboxes: list[str] = field(default_factory=list)
    docker: list[str] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    folder_removed: bool = False

    @property
    def count(self) -> int:
        return len(self.sandboxes) + len(self.docker)

    def to_dict(self) -> dict:
        return asdict(self)


def run_leftovers_here(run_id: str, root: str | os.PathLike | None = None) -> RunLeftovers:
    """Reap the run's orphans on this node, then report what of it is still alive here (see the module docstring).

    Args:
        run_id: The run.
        root: The sandbox root that holds the run's folder (default: `$RAYGRPO_SANDBOX_ROOT`, else the default).
    """
    folder = base_root(root) / run_id
    found = RunLeftovers(node_address())
    if folder.is_dir():
        found.reaped = reap_base(root, only_run=run_id).sandboxes
        if folder.is_dir():
            found.sandboxes = [s.sandbox_id for s in live_sandboxes(folder)]
            found.folder_removed = remove_if_empty(folder)
        else:
            found.folder_removed = True
    if may_have_docker():
        try:
            found.docker = run_leftovers(run_id)
        except DockerUnavailable as exc:
            logger.debug("docker not asked for leftovers: %s", exc)
    if found.count:
        logger.warning("run %s left %d sandbox(es) alive on %s: %s", run_id, found.count, found.node,
                       ", ".join(found.sandboxes + found.docker))
    return found
