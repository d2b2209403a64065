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


@pytest.mark.parametrize("override, value", [
    ("rollout.system_prompt=#1 rule: be brief", "#1 rule: be brief"),
    ("rollout.system_prompt=Answer in one word #1 rule", "Answer in one word #1 rule"),
    ("rollout.system_prompt=Be brief: answer", "Be brief: answer"),
    ("rollout.system_prompt=- first line", "- first line"),
    ('rollout.system_prompt="1.0"', "1.0"),
])
def test_a_set_value_keeps_its_hash_and_a_quoted_value_stays_a_string(override, value):
    assert load_config(ECHO, [override]).rollout.system_prompt == value


def test_a_quoted_set_value_is_a_string_and_flow_collections_still_parse():
    cfg = load_config(ECHO, ['envs.echo.split="1.0"', "envs.echo.indices=[0, 3]", "train.mixture={echo: 1e-3}",
                             "workers.num_env_actors=3", "sampling.temperature=1e-1"])
    assert cfg.envs["echo"].split == "1.0" and cfg.envs["echo"].indices == [0, 3]
    assert cfg.train.mixture == {"echo": 0.001} and cfg.workers.num_env_actors == 3
    assert cfg.sampling.temperature == 0.1
    assert load_config(ECHO, ["rollout.system_prompt='no'"]).rollout.system_prompt == "no"
    assert load_config(ECHO, ['rollout.system_prompt="#x" ']).rollout.system_prompt == "#x"
    with pytest.raises(ConfigError, match=r"duplicate key 'echo'"):
        load_config(ECHO, ["train.mixture={echo: 1, echo: 2}"])


def test_a_key_given_twice_in_a_file_is_refused_with_its_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("envs:\n  echo: {url: 'http://127.0.0.1:1'}\nrollout:\n  group_size: 8\n"
                    "sampling: {max_tokens: 64}\nrollout:\n  max_turns: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "duplicate key 'rollout' (first on line 3)" in str(err.value) and f'"{path}", line 6' in str(err.value)


def test_a_config_that_is_not_utf8_is_a_clean_error_and_a_bom_is_fine(tmp_path):
    path = tmp_path / "utf16.yaml"
    path.write_bytes("envs: {}\n".encode("utf-16"))
    with pytest.raises(ConfigError, match=r"utf16.yaml: not UTF-8 text \(byte 0xff at offset 0\)"):
        load_config(path)
    path.write_bytes(b"\xef\xbb\xbfenvs:\n  echo: {url: 'http://127.0.0.1:1'}\n")
    assert set(load_config(path).envs) == {"echo"}


def test_loading_leaves_the_callers_mapping_as_it_was():
    data = {"envs": {"echo": {"kind": "ors", "url": "http://127.0.0.1:1"}}, "rollout": {"group_size": 2}}
    load_config(data=data, overrides=["rollout.group_size=8", "envs.echo.split=test"])
    assert data == {"envs": {"echo": {"kind": "ors", "url": "http://127.0.0.1:1"}}, "rollout": {"group_size": 2}}
