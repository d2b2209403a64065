"""Env pools: groups of env pool actors that follow demand.

- `group.py`: what a group of actors is (`PoolGroup`) and how one more is started (`ActorSpawner`).
- `slot.py`: one actor as the orchestrator sees it (`PoolSlot`).
- `elastic.py`: one pool sized between a minimum and a maximum, draining idle actors and replacing lost ones.
- `poolset.py`: a run's pools together, shared by its orchestrators, and the autoscaler hint.
- `ray_metrics.py`: pool sizes, queue depth, live sandboxes, starts and failures as Ray metrics.
"""

from raygrpo.driver.pools.elastic import ElasticPool, PoolStartError
from raygrpo.driver.pools.group import ActorSpawner, PoolGroup
from raygrpo.driver.pools.poolset import PoolSet
from raygrpo.driver.pools.slot import PoolSlot, SlotState

__all__ = ["ActorSpawner", "ElasticPool", "PoolGroup", "PoolSet", "PoolSlot", "PoolStartError", "SlotState"]
