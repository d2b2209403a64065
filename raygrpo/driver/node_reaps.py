"""`raygrpo reap` on the nodes: what crashed runs left in local and docker sandboxes, on this machine or on every
node of a cluster (one Ray task per node, `raygrpo.driver.node_tasks`), as `raygrpo.sandbox.node_reap.reap_node`
reaps it. The lease ledger (remote sandboxes) is `raygrpo.leases.reaper`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from raygrpo.driver.node_tasks import on_every_node
from raygrpo.sandbox.node_reap import NodeReap, reap_node

logger = logging.getLogger(__name__)


@dataclass
class NodesReaped:
    """What the reap removed on each node, and the nodes that could not be reaped.

    Args:
        nodes: Each reaped node's report.
        failed: Node address -> why its reap did not run or finish.
    """

    nodes: list[NodeReap] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """A line per thing removed (naming the node), a line per node that failed, then a summary line."""
        out = [line for node in self.nodes for line in node.lines()]
        out += [f"{node}: not reaped: {why}" for node, why in self.failed.items()]
        local = [node.local for node in self.nodes]
        live = sorted({run for reap in local for run in reap.live_runs})
        out.append(f"{sum(len(r.sandboxes) for r in local)} sandbox(es), {sum(len(r.processes) for r in local)} "
                   f"process(es), {sum(len(r.folders) for r in local)} run folder(s) and "
                   f"{sum(len(n.docker) for n in self.nodes)} docker sandbox(es) removed on {len(self.nodes)} "
                   f"node(s); {len(live)} live run(s) untouched")
        return out

    def to_dict(self) -> dict:
        return {"nodes": [node.to_dict() for node in self.nodes], "failed": self.failed}


def reap_here(root: str | os.PathLike | None = None, stale_after_s: float = 60.0,
              run: str | None = None) -> NodesReaped:
    """Reap this machine only (`reap_node`'s arguments)."""
    return NodesReaped(nodes=[reap_node(root, stale_after_s, run)])


def reap_cluster(address: str, root: str | os.PathLike | None = None, stale_after_s: float = 60.0,
                 run: str | None = None, timeout_s: float = 120.0) -> NodesReaped:
    """Join the cluster at `address` and reap every alive node with a task of its own (`reap_node`'s arguments);
    `root` None: each node's own sandbox root (its `$RAYGRPO_SANDBOX_ROOT`, else the default)."""
    import ray

    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        answers = on_every_node(reap_node, None if root is None else str(root), stale_after_s, run,
                                timeout_s=timeout_s)
    finally:
        ray.shutdown()
    done = NodesReaped()
    for answer in answers:
        if answer.error is not None:
            done.failed[answer.node] = answer.error
        else:
            answer.result.node = answer.node
            done.nodes.append(answer.result)
    return done
