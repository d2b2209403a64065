"""Checking, before an actor is created, that the cluster can ever hold what it asks for.

Ray queues an actor whose resources no node has, forever and silently, in case an autoscaler adds such a node. A
run instead fails at start, naming the config field and the resource, when neither a live node nor a node type the
cluster's autoscaler may add (the cluster config it reports, `ray up` and KubeRay alike) offers the amount
(`check_fits`). On a local Ray, which no autoscaler grows, the run's actors must also fit together: one that finds
the CPUs taken by the others would wait forever too (`check_fits_together`). Where waiting is right (a cluster that
is adding a node), `wait_placed` says what an actor waits for instead of waiting in silence.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from raygrpo.core.errors import ResolveError

logger = logging.getLogger(__name__)


class PlacementError(ResolveError):
    """An actor asks for resources that no node offers and no autoscaler can add; the message names the field."""


def actor_resources(num_cpus: float = 0.0, num_gpus: float = 0.0, memory: int | None = None,
                    resources: dict[str, float] | None = None) -> dict[str, float]:
    """One actor's demand as Ray counts it (`CPU`, `GPU`, `memory` in bytes, custom resources); zeros left out."""
    out = {"CPU": float(num_cpus), "GPU": float(num_gpus), "memory": float(memory or 0), **(resources or {})}
    return {key: amount for key, amount in out.items() if amount}


def node_capacities() -> list[dict[str, float]]:
    """Total resources of every alive node."""
    import ray

    return [dict(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")]


def autoscaler_capacities() -> list[dict[str, float]]:
    """Resources of each node type the cluster's autoscaler may add (none without an autoscaler)."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception as exc:  # noqa: BLE001 - a private API: without it, only live nodes count
        logger.debug("no autoscaler cluster config: %s", exc)
        return []
    if config is None:
        return []
    return [{key: float(v) for key, v in group.resources.items()} for group in config.node_group_configs
            if group.max_count != 0]


def check_fits(demands: dict[str, dict[str, float]], nodes: list[dict[str, float]] | None = None,
               node_types: list[dict[str, float]] | None = None) -> None:
    """Raise `PlacementError` for the first demand that no live node and no autoscalable node type can hold.

    Args:
        demands: Config field (e.g. `envs.swe.pool`) to one actor's resources (`actor_resources`).
        nodes: Live nodes' totals (default: asked of Ray).
        node_types: Node types an autoscaler may add (default: from the cluster config the autoscaler reports).
    """
    nodes = node_capacities() if nodes is None else nodes
    node_types = autoscaler_capacities() if node_types is None else node_types
    for field, demand in demands.items():
        if any(_fits(demand, node) for node in [*nodes, *node_types]):
            continue
        missing = sorted(key for key in demand if not any(key in node for node in [*nodes, *node_types]))
        offered = sorted({key for node in [*nodes, *node_types] for key in node if not key.startswith("node:")})
        what = (f"no node offers {', '.join(repr(k) for k in missing)}" if missing
                else f"no single node has {_show(demand)}")
        scaler = "and the cluster has no autoscaler node type with it" if node_types else "and no autoscaler can add one"
        raise PlacementError(f"{field}: one actor asks for {_show(demand)}; {what} {scaler} (nodes offer: "
                             f"{', '.join(offered) or 'nothing'})")


def check_fits_together(actors: dict[str, tuple[dict[str, float], int]],
                        available: dict[str, float] | None = None, hint: str = "", settle_s: float = 15.0) -> None:
    """Raise `PlacementError` when the run's actors, started together, ask for more of a resource than is free.

    Meant for a local Ray (no autoscaler adds nodes, nothing else shares it): there an actor that does not fit beside
    the others waits forever for resources the others keep for the whole run.

    Args:
        actors: Config field (e.g. `train.learner`) to one actor's resources and how many such actors start.
        available: What is free (default: asked of Ray, again for up to `settle_s` seconds while it falls short,
            since the actors of a run that just ended give theirs back a moment after they are stopped).
        hint: Appended to the error (e.g. how to give a local Ray more CPUs).
    """
    import ray

    wanted: dict[str, float] = {}
    for demand, count in actors.values():
        for key, amount in demand.items():
            wanted[key] = wanted.get(key, 0.0) + amount * count
    deadline = time.monotonic() + (settle_s if available is None else 0.0)
    while True:
        free = available if available is not None else {k: float(v) for k, v in ray.available_resources().items()}
        short = [key for key, amount in wanted.items() if amount > free.get(key, 0.0) + 1e-9]
        if not short:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    parts = ", ".join(f"{field} {_show(demand)}" + (f" x{count}" if count != 1 else "")
                      for field, (demand, count) in actors.items() if count and any(k in demand for k in short))
    has = ", ".join(_show({key: free.get(key, 0.0)})[1:-1] for key in short)
    raise PlacementError(f"the run's actors together ask for {_show({k: wanted[k] for k in short})} ({parts}), but "
                         f"the Ray runtime has {has} free and no autoscaler: one of them would wait forever"
                         + (f"; {hint}" if hint else ""))


def wait_placed(ref: Any, field: str, demand: dict[str, float], warn_every_s: float = 60.0) -> Any:
    """`ray.get(ref)` for the first call of a new actor, with a warning every `warn_every_s` while it is not
    placed: what the actor (config `field`) asks for, and what the cluster has free (an autoscaler may be adding a
    node, so this waits rather than fails)."""
    import ray

    began = time.monotonic()
    while True:
        ready, _ = ray.wait([ref], timeout=warn_every_s)
        if ready:
            return ray.get(ready[0])
        available = ray.available_resources()
        free = {key: float(available.get(key, 0.0)) for key in demand}
        logger.warning("%s: not placed after %.0f s; it asks for %s and the cluster has %s free (waiting for a node "
                       "that has it)", field, time.monotonic() - began, _show(demand), _show(free))


def _fits(demand: dict[str, float], node: dict[str, Any]) -> bool:
    return all(float(node.get(key, 0.0)) >= amount for key, amount in demand.items())


def _show(demand: dict[str, float]) -> str:
    parts = []
    for key, amount in demand.items():
        parts.append(f"memory={amount / 2**30:.3g}GiB" if key == "memory" else f"{key}={amount:g}")
    return "{" + ", ".join(parts) + "}"
