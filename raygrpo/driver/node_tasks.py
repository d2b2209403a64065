"""Running one function on every node of the Ray cluster: what is node-local (sandbox folders, processes, docker
engines) can only be looked after on its own node.

`on_every_node` starts one Ray task per alive node, pinned there (`NodeAffinitySchedulingStrategy`, not soft: a
node that dies meanwhile gets an error, never its task run somewhere else), with no CPU asked (a head node with no
CPUs still runs it), and collects each node's answer under the node's address. A node whose task failed or did not
answer within the time-out is reported with the reason instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raygrpo.core.errors import describe

logger = logging.getLogger(__name__)


@dataclass
class NodeAnswer:
    """One node's answer: its result, or why there is none.

    Args:
        node: The node's address.
        node_id: Ray's id of the node.
        result: What the function returned there (None when it failed).
        error: Why it failed or did not answer, when it did not.
    """

    node: str
    node_id: str
    result: Any = None
    error: str | None = None


def alive_nodes() -> list[dict[str, Any]]:
    """The nodes Ray counts alive (`ray.nodes()` entries)."""
    return [n for n in ray.nodes() if n.get("Alive")]


def on_every_node(fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> list[NodeAnswer]:
    """Run `fn(*args)` once on every alive node (see the module docstring); the answers in node order.

    Args:
        fn: A module-level function (Ray pickles it by reference).
        timeout_s: How long to wait for all the answers.
    """
    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    pending: dict[Any, NodeAnswer] = {}
    answers: list[NodeAnswer] = []
    for node in alive_nodes():
        answer = NodeAnswer(node["NodeManagerAddress"], node["NodeID"])
        answers.append(answer)
        strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        pending[task.options(scheduling_strategy=strategy, name=f"{fn.__name__}@{answer.node}").remote(*args)] = answer
    ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    for ref in ready:
        try:
            pending[ref].result = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - one node's failure is reported, the others' answers kept
            pending[ref].error = describe(exc)
    for ref in late:
        pending[ref].error = f"no answer within {timeout_s:g} s"
        ray.cancel(ref, force=True)
    for answer in answers:
        if answer.error:
            logger.warning("node %s: %s failed: %s", answer.node, fn.__name__, answer.error)
    return answers
