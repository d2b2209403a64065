"""Where an env pool actor that failed to start was placed, so its pool can keep replacements off that node.

An actor's start can fail for its node's sake (the node is dying and Ray still counts it alive; its disk or sandbox
root is unusable; an import is broken there): a replacement placed on the same node fails the same way, seconds
later. Ray's error says little about the place, so the node is asked of the GCS's actor table (where the actor was
placed, by node id); failing that, the `ip:` or `ip=` the error names is mapped to the one alive node with that
address.
"""

from __future__ import annotations

import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

_IP = re.compile(r"\bip[:=]\s*([0-9A-Fa-f.:]+[0-9A-Fa-f])")


def node_of_actor(handle: Any) -> str | None:
    """The id of the node the GCS placed an actor on, or None when it was never placed or the GCS cannot say."""
    try:
        from ray._private.state import actors

        record = actors(actor_id=handle._actor_id.hex())
    except Exception as exc:  # noqa: BLE001 - the GCS is a best-effort source here
        logger.debug("no actor table entry: %s", exc)
        return None
    node_id = ((record or {}).get("Address") or {}).get("NodeID") or ""
    return node_id if node_id.strip("0") else None


def node_of_error(exc: BaseException) -> str | None:
    """The id of the node whose address the error names, when exactly one alive node has it."""
    found = _IP.search(str(exc))
    if not found:
        return None
    import ray

    ids = {n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("NodeManagerAddress") == found.group(1)}
    return ids.pop() if len(ids) == 1 else None


def failed_start_node(handle: Any, exc: BaseException) -> str | None:
    """The node an actor that failed to start was on (see the module docstring), or None when unknown."""
    return node_of_actor(handle) or node_of_error(exc)
