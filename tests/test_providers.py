"""Provider limits in one place: the run config's `providers:` section, `envs.<name>.provider`, and how the limits
reach the governor (once per provider, from the driver) and the env pool actors' gates (through the env kind).

No Ray: the driver's step that configures the governors is called with `ensure_governor` recorded, and the gates are
this process's own.
"""

from __future__ import annotations

import logging

import pytest

from raygrpo.config import ConfigError, load_config
from raygrpo.driver import launch
from raygrpo.driver.launch import RolloutRuntime
from raygrpo.driver.pools import ActorSpawner, ElasticPool, PoolGroup
from raygrpo.envs.kinds import HarborKind, ORSKind, kind_of
from raygrpo.governor.gate import reset_gates
from raygrpo.sandbox.owners import ROOT_ENV
from raygrpo.specs import ProviderSpec
from tests.harbor_utils import EXAMPLE_TASKS

pytestmark = pytest.mark.timeout(60)

HARBOR = "examples/harbor_local/rollout.yaml"


def two_suites_on_e2b(**extra) -> dict:
    """Two Harbor suites on one backend (`e2b`, so one provider) and one `providers:` entry for it."""
    suite = {"kind": "harbor", "path": str(EXAMPLE_TASKS), "environment_type": "e2b"}
    return {
        "envs": {"swe": {**suite, "max_concurrent_starts": 4}, "sql": {**suite, "max_concurrent_starts": 4}},
        "providers": {"e2b": {"create_rate_per_s": 5, "max_live": 100, "rate_limit_backoff": {"initial_s": 2}}},
        **extra,
    }


@pytest.fixture(autouse=True)
def _fresh_gates(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "sandboxes"))
    reset_gates()
    yield
    reset_gates()


def test_two_suites_on_one_provider_share_its_one_entry_and_the_governor_gets_its_limits_once(monkeypatch):
    cfg = load_config(data=two_suites_on_e2b())
    assert cfg.envs["swe"].provider_key == cfg.envs["sql"].provider_key == "e2b"
    configured: list[tuple] = []
    monkeypatch.setattr(launch, "ensure_governor",
                        lambda key, rate, timeout_s=60.0, **kw: configured.append((key, rate, kw)) or {})
    runtime = RolloutRuntime(cfg, {"swe": None, "sql": None})
    runtime.start_governors()
    assert configured == [("e2b", 5.0, {"max_live": 100})]
    assert runtime.provider_limits() == {"e2b": cfg.providers["e2b"]}


def test_an_explicit_provider_joins_suites_of_different_backends(monkeypatch):
    data = two_suites_on_e2b()
    data["envs"]["local"] = {"kind": "harbor", "path": str(EXAMPLE_TASKS), "provider": "e2b",
                             "max_concurrent_starts": 4}
    cfg = load_config(data=data)
    configured: list[str] = []
    monkeypatch.setattr(launch, "ensure_governor", lambda key, rate, **kw: configured.append(key) or {})
    RolloutRuntime(cfg, {name: None for name in cfg.envs}).start_governors()
    assert cfg.envs["local"].backend == "local" and configured == ["e2b"]


def test_a_provider_without_an_entry_has_no_limits_and_no_governor(monkeypatch):
    cfg = load_config(HARBOR)
    assert cfg.providers == {} and cfg.envs["local"].provider_key == "local"
    assert HarborKind().limits(cfg.envs["local"], cfg.providers) is None
    configured: list[str] = []
    monkeypatch.setattr(launch, "ensure_governor", lambda key, rate, **kw: configured.append(key) or {})
    RolloutRuntime(cfg, {"local": None}).start_governors()
    assert configured == []


async def test_the_env_kind_hands_both_suites_the_entrys_limits_and_they_share_one_gate(caplog):
    """In an env pool actor: each suite's provider gets the one entry's limits from its kind, and the two suites'
    gates are one, set from that entry (no "already set" warning: nothing to disagree about)."""
    cfg = load_config(data=two_suites_on_e2b())
    swe, sql = (kind_of(cfg.envs[n]).provider(cfg.envs[n], n, providers=cfg.providers) for n in ("swe", "sql"))
    assert swe.limits is sql.limits is cfg.providers["e2b"]
    with caplog.at_level(logging.WARNING, logger="raygrpo.governor.gate"):
        gate = swe.gate
        assert sql.gate is gate
    stats = gate.stats()
    assert (stats["key"], stats["rate_per_s"], stats["max_live"]) == ("e2b", 5.0, 100)
    assert gate.backoff.initial_s == 2.0
    assert "already set" not in caplog.text


@pytest.mark.parametrize("field, value", [
    ("create_rate_per_s", "5"),
    ("max_live", "100"),
    ("rate_limit_backoff", '{"initial_s": 2}'),
])
def test_a_provider_limit_on_an_environment_fails_at_load_naming_providers(field, value):
    with pytest.raises(ConfigError) as info:
        load_config(HARBOR, [f"envs.local.{field}={value}"])
    message = str(info.value)
    assert "envs.local" in message and f"`{field}` moved to providers.<provider>.{field}" in message


def test_rate_limit_key_fails_at_load_naming_provider():
    with pytest.raises(ConfigError) as info:
        load_config(HARBOR, ["envs.local.rate_limit_key=team"])
    assert "`rate_limit_key` is now envs.<name>.provider" in str(info.value) and "providers:" in str(info.value)


def test_a_providers_entry_no_environment_names_fails_at_load():
    """A misspelt provider on either side leaves an entry nobody draws from: an error, not limits silently lifted."""
    data = two_suites_on_e2b()
    data["envs"]["swe"]["provider"] = "e2bb"
    data["envs"]["sql"]["provider"] = "e2bb"
    with pytest.raises(ConfigError) as info:
        load_config(data=data)
    assert "providers: ['e2b'] are named by no environment (theirs: ['e2bb'])" in str(info.value)
    # Named by an eval environment only is named all the same.
    data = two_suites_on_e2b(eval_envs={"held_out": {"kind": "harbor", "path": str(EXAMPLE_TASKS),
                                                     "provider": "team"}}, train={"eval_every": 5})
    data["providers"]["team"] = {"max_live": 3}
    assert load_config(data=data).providers["team"].max_live == 3


@pytest.mark.parametrize("entry, field", [
    ({"create_rate_per_s": 0}, "providers.e2b.create_rate_per_s"),
    ({"max_live": 0}, "providers.e2b.max_live"),
    ({"rate_limit_backoff": {"initial_s": 5, "max_s": 1}}, "providers.e2b.rate_limit_backoff"),
    ({"max_concurrent_starts": 4}, "providers.e2b.max_concurrent_starts"),  # a per-actor setting: stays on the env
])
def test_provider_field_errors_name_the_field(entry, field):
    data = two_suites_on_e2b()
    data["providers"]["e2b"] = entry
    with pytest.raises(ConfigError) as info:
        load_config(data=data)
    assert field in str(info.value)


def test_pool_max_concurrent_fails_naming_max_concurrent_per_actor():
    with pytest.raises(ConfigError) as info:
        load_config(HARBOR, ['envs.local.pool={"num_actors": 1, "max_concurrent": 4}'])
    assert "envs.local.pool" in str(info.value) and "`max_concurrent` is now `max_concurrent_per_actor`" in str(
        info.value)
    cfg = load_config(HARBOR, ['envs.local.pool={"num_actors": 1, "max_concurrent_per_actor": 4}'])
    assert RolloutRuntime(cfg, {"local": None})._pool_groups()[0].max_concurrent_per_actor == 4


def test_the_env_kind_gives_the_warm_depth_the_pool_hints_by():
    cfg = load_config(data={"envs": {
        "auto": {"kind": "harbor", "path": str(EXAMPLE_TASKS), "warm_pool": {"size": "auto", "max_size": 6}},
        "fixed": {"kind": "harbor", "path": str(EXAMPLE_TASKS), "warm_pool": {"size": 3}},
        "cold": {"kind": "harbor", "path": str(EXAMPLE_TASKS)},
        "echo": {"url": "http://127.0.0.1:1"},
    }})
    assert [kind_of(s).warm_depth(s) for s in cfg.envs.values()] == [6, 3, 0, 0]
    assert isinstance(kind_of(cfg.envs["echo"]), ORSKind) and kind_of(cfg.envs["echo"]).limits(
        cfg.envs["echo"], {"local": ProviderSpec(max_live=1)}) is None
    template = RolloutRuntime(cfg, {n: None for n in cfg.envs})  # only for its groups' shape
    (group,) = template._pool_groups()
    pool = ElasticPool.from_spawner(ActorSpawner(PoolGroup(group.field, "p", group.envs, 2, 0.0), settings=None))
    assert pool.warm_envs == {"auto", "fixed"} and pool.warm_depth == 6


def test_suites_on_one_provider_with_different_start_bounds_are_refused_at_load():
    """One actor's gate of a provider holds one `max_concurrent_starts`: different values, one of them silently
    ignored before, are refused, naming both suites and the field."""
    data = two_suites_on_e2b()
    data["envs"]["sql"]["max_concurrent_starts"] = 16
    with pytest.raises(ValueError, match=r"envs\.sql\.max_concurrent_starts=16 differs from "
                                         r"envs\.swe\.max_concurrent_starts=4, on the same provider 'e2b'"):
        load_config(data=data)
    data["envs"]["sql"].pop("max_concurrent_starts")  # unset is "no bound": a different value too
    with pytest.raises(ValueError, match=r"envs\.sql\.max_concurrent_starts=None differs"):
        load_config(data=data)
    data["envs"]["sql"]["provider"] = "e2b-other"  # another provider: its own gate, its own bound
    assert load_config(data=data).envs["sql"].max_concurrent_starts is None


def test_an_elastic_pool_grows_no_further_than_its_providers_live_cap_keeps_busy():
    """max_live=5 with K=2: 3 actors keep every live ticket busy; more would only wait for tickets (and hold CPUs)."""
    workers = {"min_env_actors": 0, "max_env_actors": 8, "max_concurrent_per_actor": 2}
    data = two_suites_on_e2b(workers=workers)
    data["providers"]["e2b"]["max_live"] = 5
    (group,) = RolloutRuntime(load_config(data=data), {"swe": None, "sql": None})._pool_groups()
    assert group.max_live == 5
    pool = ElasticPool.from_spawner(ActorSpawner(group, settings=None))
    assert pool.size_for(100) == 3 and pool.size_for(4) == 2 and pool.size_for(0) == 0
    data["providers"]["e2b"].pop("max_live")  # no cap: demand alone sizes it, up to max_env_actors
    (group,) = RolloutRuntime(load_config(data=data), {"swe": None, "sql": None})._pool_groups()
    assert group.max_live is None and ElasticPool.from_spawner(ActorSpawner(group, settings=None)).size_for(100) == 8
