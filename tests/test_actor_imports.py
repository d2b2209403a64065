"""An env pool actor imports what its work needs and no more: with a scripted policy on an ORS environment, starting
it (importing `raygrpo.actors.env_pool`, building the worker: tokenizer, chat template, policy, providers) and
writing an ORS tool's schema (its first rollout) load neither torch, TRL nor transformers. Each was seconds of every
actor start (transformers and torch came with `AutoTokenizer`: 13 s on a loaded 2-core machine; transformers again
with `get_json_schema` in the first rollout), which an elastic pool pays at every burst."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
#: Packages an env pool actor with a scripted (or vLLM, or engine-backed) policy must not import.
FORBIDDEN = ("torch", "trl", "transformers", "datasets", "pyarrow", "matplotlib")

#: What the actor does at start, in a fresh interpreter; prints the forbidden packages it imported.
ACTOR_START = textwrap.dedent("""
    import json, sys
    import raygrpo.actors.env_pool
    from raygrpo.agent.worker import RolloutWorker, WorkerSettings
    from raygrpo.config import load_config

    model, forbidden = sys.argv[1], sys.argv[2].split(",")
    cfg = load_config(data={"envs": {"echo": {"kind": "ors", "url": "http://127.0.0.1:9/"}}, "model": model,
                            "policy": {"kind": "scripted", "script": "examples/echo/policies.py:right"}})
    settings = WorkerSettings("imports", dict(cfg.envs), cfg.policy, cfg.model, cfg.sampling, cfg.rollout,
                              max_concurrent_per_actor=1)
    worker = RolloutWorker.build(settings)
    ids = worker.renderer.prompt_ids([{"role": "user", "content": "Please echo: hello"}], None)
    assert ids and ids[-1] != worker.renderer.eos_token_id
    from raygrpo.envs.ors.tools import tool_schemas  # what an ORS session's first prompt needs
    assert tool_schemas([{"name": "echo", "description": "Echo.", "input_schema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}])
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(forbidden))))
""")


def _settings(model_dir: str):
    from raygrpo.agent.worker import WorkerSettings
    from raygrpo.config import load_config

    cfg = load_config(data={"envs": {"echo": {"kind": "ors", "url": "http://127.0.0.1:9/"}}, "model": model_dir,
                            "policy": {"kind": "scripted", "script": str(ROOT / "examples/echo/policies.py:right")}})
    return WorkerSettings("imports", dict(cfg.envs), cfg.policy, cfg.model, cfg.sampling, cfg.rollout,
                          max_concurrent_per_actor=1)


def test_starting_an_actor_imports_no_model_stack(tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", ACTOR_START, tiny_model_dir, ",".join(FORBIDDEN)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.ray
def test_a_ready_env_pool_actor_has_imported_no_model_stack(ray_local, tiny_model_dir):
    import ray

    from raygrpo.actors.env_pool import EnvPoolActor

    # Its own runtime env: a fresh worker process, not one that ran other tests' tasks.
    actor = EnvPoolActor.options(num_cpus=0, runtime_env={"env_vars": {"RAYGRPO_TEST_FRESH_WORKER": "imports"}}).remote(
        _settings(tiny_model_dir))
    try:
        ray.get(actor.ready.remote(), timeout=180)
        loaded = ray.get(actor.__ray_call__.remote(lambda self: sorted({m.split(".")[0] for m in sys.modules})),
                         timeout=60)
        # Ray's own serialization context imports pyarrow in every worker that deserializes arguments
        # (`ray.util.serialization_addons`), whatever the actor runs: not raygrpo's to avoid.
        forbidden = set(FORBIDDEN) - {"pyarrow"}
        assert not set(loaded) & forbidden, sorted(set(loaded) & forbidden)
        assert {"tokenizers", "jinja2", "openreward"} <= set(loaded)  # what it does need
    finally:
        ray.kill(actor)
