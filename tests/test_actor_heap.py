"""Actors leave their start-up heap out of garbage collections (`raygrpo.actors.heap.freeze_heap`): without it,
every full collection in an env pool actor walked the ~260k objects of Ray, the tokenizer and transformers again,
~0.15 s each (`benchmarks/rollout_path.py --no-freeze` shows the runs). The embedded ORS server's is checked in
`test_ors_server.py`."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from raygrpo.actors.heap import freeze_heap

pytestmark = pytest.mark.timeout(120)


def test_freeze_heap_collects_garbage_first_and_freezes_what_is_left():
    class Node:
        pass

    def cycle() -> None:
        a, b = Node(), Node()
        a.other, b.other = b, a

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(1000):
            cycle()  # unreachable cycles only a collection frees
        freeze_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 1000
        assert not [o for o in gc.get_objects() if isinstance(o, Node)]  # collected, not frozen
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


@pytest.mark.ray
def test_an_env_pool_actor_freezes_its_heap_once_its_worker_is_built(ray_local):
    import ray

    from raygrpo.actors.env_pool import EnvPoolActor
    from raygrpo.config import load_config
    from raygrpo.agent.worker import WorkerSettings

    suite = Path(__file__).resolve().parent.parent / "examples" / "harbor_local" / "tasks"
    cfg = load_config(data={"envs": {"suite": {"kind": "harbor", "path": str(suite)}}, "policy": {"kind": "noop"}})
    settings = WorkerSettings(name="heap", envs=dict(cfg.envs), policy=cfg.policy, model=cfg.model, sampling=cfg.sampling,
                              rollout=cfg.rollout, max_concurrent_per_actor=1)
    actor = EnvPoolActor.options(num_cpus=0).remote(settings)
    try:
        frozen_before = ray.get(actor.__ray_call__.remote(lambda self: gc.get_freeze_count()), timeout=60)
        ray.get(actor.ready.remote(), timeout=60)
        frozen = ray.get(actor.__ray_call__.remote(lambda self: gc.get_freeze_count()), timeout=60)
        assert frozen > frozen_before + 10_000, (frozen_before, frozen)
    finally:
        ray.kill(actor)
