"""Run config: validation errors name the field, overrides apply before validation, paths resolve to the file."""

import pytest

from raygrpo.config import ConfigError, apply_overrides, load_config

pytestmark = pytest.mark.timeout(30)

ECHO = "examples/echo/rollout.yaml"


def test_example_config_loads_and_resolves_against_its_folder():
    cfg = load_config(ECHO)
    assert set(cfg.envs) == {"echo"}
    assert cfg.base_dir.endswith("examples/echo")
    assert cfg.policy.kind == "scripted"


def test_overrides_apply_and_parse_yaml_scalars():
    cfg = load_config(ECHO, ["workers.num_env_actors=3", "policy.kind=transformers", "rollout.system_prompt=Be brief"])
    assert cfg.workers.num_env_actors == 3
    assert cfg.policy.kind == "transformers"
    assert cfg.rollout.system_prompt == "Be brief"


@pytest.mark.parametrize(
    "override, field",
    [
        ("workers.num_env_actorz=3", "workers.num_env_actorz"),
        ("envs.echo.num_taks=3", "envs.echo.num_taks"),
        ("rollout.max_turns=0", "rollout.max_turns"),
        ("workers.max_concurrent_per_actor=lots", "workers.max_concurrent_per_actor"),
        ("policy.kind=gpt", "policy.kind"),
    ],
)
def test_bad_keys_and_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as info:
        load_config(ECHO, [override])
    assert field in str(info.value)


def test_override_into_a_scalar_is_an_error():
    with pytest.raises(ConfigError, match="model is not a mapping"):
        apply_overrides({"model": "tiny"}, ["model.path=x"])


def test_missing_file_and_bad_override_syntax():
    with pytest.raises(ConfigError, match="not found"):
        load_config("nope.yaml")
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config(ECHO, ["no-equals-sign"])


def test_no_envs_is_an_error():
    with pytest.raises(ConfigError, match="envs"):
        load_config(data={"envs": {}})


def test_weight_on_an_environment_fails_naming_train_mixture():
    with pytest.raises(ConfigError) as info:
        load_config(ECHO, ["envs.echo.weight=2"])
    message = str(info.value)
    assert "envs.echo" in message and "`weight`" in message and "train.mixture" in message


@pytest.mark.parametrize("field, owner", [
    ("start_timeout_s", "envs.<name>.start_timeout_s"),
    ("tool_timeout_s", "envs.<name>.tool_timeout_s"),
    ("score_timeout_s", "envs.<name>.verifier_timeout_s"),
])
def test_moved_rollout_deadlines_fail_naming_their_owner(field, owner):
    with pytest.raises(ConfigError) as info:
        load_config(ECHO, [f"rollout.{field}=30"])
    assert f"`{field}` moved to {owner}" in str(info.value)


def test_loading_reads_nothing_a_config_names(tmp_path):
    """Loading validates fields only: missing task folders, files and classes are found by the resolve step."""
    cfg = load_config(data={
        "envs": {
            "suite": {"kind": "harbor", "path": str(tmp_path / "no-such-suite"), "harness": "nowhere.py:H",
                      "import_path": "no_such_module:Env"},
            "ors": {"environment": "missing.py:Env"},
        },
        "policy": {"kind": "scripted", "script": "missing_policies.py:right"},
        "model": str(tmp_path / "no-such-model"),
    })
    assert cfg.envs["ors"].environment.endswith("/missing.py:Env")  # made absolute, not opened
    assert cfg.policy.script.endswith("/missing_policies.py:right")


@pytest.mark.parametrize("workers, pool, field", [
    ({"num_env_actors": 2, "max_env_actors": 4}, None, "workers"),
    ({"min_env_actors": 5, "max_env_actors": 4}, None, "workers"),
    ({}, {"num_actors": 2, "min_actors": 1}, "envs.echo.pool"),
    ({}, {"min_actors": 3, "max_actors": 2}, "envs.echo.pool"),
])
def test_a_pool_is_fixed_or_elastic_not_both(workers, pool, field):
    echo = {"kind": "ors", "url": "http://127.0.0.1:1", **({"pool": pool} if pool else {})}
    with pytest.raises(ConfigError) as err:
        load_config(data={"envs": {"echo": echo}, "workers": workers})
    assert field in str(err.value)


def test_elastic_bounds_default_to_min_0_and_the_fixed_count():
    from raygrpo.driver.launch import _bounds

    assert _bounds(3, None, None, 2) == (3, 3)      # num_actors: fixed
    assert _bounds(None, None, None, 2) == (2, 2)   # neither: workers.num_env_actors, fixed
    assert _bounds(None, None, 6, 2) == (0, 6)      # max only: an idle pool holds nothing
    assert _bounds(None, 4, None, 2) == (4, 4)      # min only: at least the fixed count
    assert _bounds(None, 1, 8, 2) == (1, 8)


@pytest.mark.parametrize("policy, engine_actors", [
    ({"kind": "transformers"}, True),
    ({"kind": "vllm"}, True),                                  # vLLM engine actors
    ({"kind": "vllm", "url": "http://127.0.0.1:8000"}, False),  # a server TRL syncs
    ({"kind": "scripted", "script": "m:f"}, False),
])
def test_which_policies_run_as_engine_actors(policy, engine_actors):
    cfg = load_config(data={"envs": {"e": {"kind": "ors", "url": "http://127.0.0.1:1"}}, "policy": policy})
    assert cfg.policy.engine_actors is engine_actors


@pytest.mark.parametrize("policy", [
    {"kind": "transformers", "vllm": {"dtype": "bfloat16"}},
    {"kind": "vllm", "url": "http://127.0.0.1:8000", "vllm": {"dtype": "bfloat16"}},
])
def test_vllm_engine_arguments_are_refused_where_no_vllm_engine_actor_would_read_them(policy):
    with pytest.raises(ConfigError) as err:
        load_config(data={"envs": {"e": {"kind": "ors", "url": "http://127.0.0.1:1"}}, "policy": policy})
    assert "policy.vllm" in str(err.value)
