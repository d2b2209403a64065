"""The lifetime each built-in Harbor backend gets from the lease ledger: the argument name and unit as Harbor's own
constructor takes them, the derived value written in that unit, and the lease's expiry from it (a lease without one
is never known gone, and `raygrpo reap` then reports it on every run). A warm pool's `ttl_s` is part of the lifetime:
a warm sandbox adopted late must not be ended by the provider under its rollout."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import harbor.environments
import pytest

from raygrpo.envs.harbor.leases import LIFETIME_MARGIN_S, HarborLeases
from raygrpo.envs.harbor.tasks import load_task
from raygrpo.leases.hooks import BUILTIN_LIFETIME_KWARGS, lease_policy
from raygrpo.leases.ledger import LeaseLedger
from raygrpo.specs import HarborSpec
from tests.harbor_utils import EXAMPLE_TASKS

HARBOR_ENVS = Path(list(harbor.environments.__path__)[0])

#: backend -> (Harbor source file, class, argument, seconds per unit, counts from the last activity)
EXPECTED = {
    "e2b": ("e2b.py", "E2BEnvironment", "sandbox_timeout_secs", 1, False),
    "modal": ("modal.py", "ModalEnvironment", "sandbox_timeout_secs", 1, False),
    "daytona": ("daytona/environment.py", "DaytonaEnvironment", "auto_stop_interval_mins", 60, True),
    "opensandbox": ("opensandbox.py", "OpenSandboxEnvironment", "sandbox_timeout_sec", 1, False),
    "prime": ("prime.py", "PrimeEnvironment", "timeout_minutes", 60, False),
    "vercel": ("vercel/environment.py", "VercelSandboxEnvironment", "sandbox_lifetime_seconds", 1, False),
    "sail": ("sail.py", "SailEnvironment", "max_lifetime_seconds", 1, False),
    "tensorlake": ("tensorlake.py", "TensorLakeEnvironment", "timeout_secs", 1, False),
}


def _init_args(source: Path, cls: str) -> list[str]:
    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.lower() == cls.lower():
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return [a.arg for a in item.args.args + item.args.kwonlyargs]
    raise AssertionError(f"no {cls}.__init__ in {source}")


def _task():
    return load_task(str(sorted(p for p in EXAMPLE_TASKS.iterdir() if p.is_dir())[0]))


def test_every_backend_with_a_lifetime_is_checked_here():
    assert set(BUILTIN_LIFETIME_KWARGS) == set(EXPECTED)


@pytest.mark.parametrize("backend", sorted(EXPECTED))
def test_a_builtin_backend_gets_its_lifetime_in_its_own_argument_and_unit(backend, tmp_path):
    source, cls, kwarg, unit, idle = EXPECTED[backend]
    assert kwarg in _init_args(HARBOR_ENVS / source, cls), "the argument Harbor's backend takes"
    policy = lease_policy(backend)
    assert (policy.lifetime_kwarg, policy.lifetime_unit_s, policy.lifetime_idle) == (kwarg, unit, idle)
    spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type=backend, start_timeout_s=100, stop_timeout_s=20,
                      verifier_timeout_s=50)
    leases = HarborLeases(spec, "suite", rollout_timeout_s=400, ledger=LeaseLedger(tmp_path / "leases"))
    derived = 100 + 400 + 50 + 20 + LIFETIME_MARGIN_S
    assert leases.backend_kwargs({}, _task(), "s") == {kwarg: math.ceil(derived / unit)}
    assert leases._expires_after_s(_task()) == (2 if idle else 1) * derived
    mine = HarborSpec(path=str(EXAMPLE_TASKS), environment_type=backend, environment_kwargs={kwarg: 30})
    assert HarborLeases(mine, "suite", ledger=LeaseLedger(tmp_path / "leases")).lifetime_s(_task()) == 30 * unit


async def test_a_modal_lease_has_an_expiry(tmp_path):
    spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="modal")
    leases = HarborLeases(spec, "suite", rollout_timeout_s=400, ledger=LeaseLedger(tmp_path / "leases"))
    lease = await leases.intent("t__abc__env", _task())
    assert lease is not None and lease.expires is not None


def test_a_warm_pools_ttl_is_part_of_the_lifetime(tmp_path):
    def derived(warm_pool):
        spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="e2b", start_timeout_s=100, stop_timeout_s=20,
                          verifier_timeout_s=50, warm_pool=warm_pool)
        return HarborLeases(spec, "suite", rollout_timeout_s=400,
                            ledger=LeaseLedger(tmp_path / "leases")).derived_lifetime_s(_task())

    assert derived({"size": 1, "ttl_s": 600}) == derived(None) + 600
