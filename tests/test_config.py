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
    from raygrpo.config.run import pool_bounds as _bounds

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


URL_ENV = {"e": {"kind": "ors", "url": "http://127.0.0.1:1"}}
SERVER = {"kind": "vllm", "url": "http://127.0.0.1:8000"}
SCRIPTED = {"kind": "scripted", "script": "m:f"}


def _load(**sections):
    return load_config(data={"envs": URL_ENV, **sections})


@pytest.mark.parametrize("policy, refused", [
    ({"kind": "transformers", "url": "http://127.0.0.1:8000"}, "policy.url names a vLLM server"),
    ({"kind": "transformers", "serve": {"port": 1}}, "policy.serve names a vLLM server"),
    ({**SCRIPTED, "url": "http://127.0.0.1:8000"}, "policy.url names a vLLM server"),
    ({"kind": "transformers", "served_model_name": "m"}, "policy.served_model_name: read only for a vLLM server"),
    ({"kind": "vllm", "served_model_name": "m"}, "this policy is vLLM engine actors"),
    ({**SCRIPTED, "request_timeout_s": 5}, "policy.request_timeout_s: deadline of a generation"),
    ({**SCRIPTED, "num_engines": 4}, "policy.num_engines: settings of raygrpo's engine actors"),
    ({**SCRIPTED, "device": "cpu"}, "policy.device: settings of raygrpo's engine actors"),
    ({"kind": "noop", "max_batch_size": 4}, "policy.max_batch_size: settings of raygrpo's engine actors"),
    ({"kind": "oracle", "engine_resources": {"gpu_node": 1}}, "policy.engine_resources"),
    ({**SERVER, "engine_num_cpus": 2, "num_engines": 2}, "policy.num_engines, policy.engine_num_cpus: settings"),
])
def test_policy_fields_the_kind_never_reads_are_refused_naming_them(policy, refused):
    """`--set policy.url=...` without `policy.kind=vllm` used to start a local transformers engine and exit 0."""
    with pytest.raises(ConfigError) as err:
        _load(policy=policy)
    assert refused in str(err.value)


def test_policy_fields_are_accepted_where_read_and_defaults_never_count_as_set():
    with pytest.raises(ConfigError, match="policy.url names a vLLM server"):
        load_config(ECHO, ["policy.url=http://127.0.0.1:8000"])  # the example's kind: scripted
    assert _load(policy={"kind": "transformers", "num_engines": 2, "device": "cuda", "max_batch_size": 4})
    assert _load(policy={"kind": "vllm", "max_batch_size": 4, "engine_resources": {"gpu": 1}}).policy.engine_actors
    assert _load(policy={**SERVER, "served_model_name": "m", "request_timeout_s": 5}).policy.request_timeout_s == 5
    # an engine actor's generation has the same deadline (a hung engine is policy_error, not a truncated rollout)
    assert _load(policy={"kind": "transformers", "request_timeout_s": 5}).policy.request_timeout_s == 5
    assert _load(policy={"kind": "vllm", "request_timeout_s": 5}).policy.request_timeout_s == 5
    assert _load(policy={"kind": "vllm", "serve": {"port": 0}, "served_model_name": "m"}).policy.serve is not None
    # null reads as unset; switching the example's kind leaves no default behind that counts as set.
    assert _load(policy={**SCRIPTED, "url": None, "serve": None}).policy.kind == "scripted"
    assert load_config(ECHO, ["policy.kind=transformers"]).policy.kind == "transformers"
    assert load_config(ECHO, ["policy.kind=noop", "policy.script=null"]).policy.kind == "noop"


@pytest.mark.parametrize("device", ["gpu", "cuda:1", "CUDA", "mps"])
def test_policy_device_is_checked_at_load(device):
    with pytest.raises(ConfigError) as err:
        _load(policy={"kind": "transformers", "device": device})
    assert "policy.device" in str(err.value) and "cpu, cuda, cuda:0" in str(err.value)
    assert _load(policy={"kind": "transformers", "device": "cuda:0"}).policy.device == "cuda:0"


def test_eval_envs_without_eval_every_are_refused_and_an_explicit_0_warns(caplog):
    held_out = {"held": {"kind": "ors", "url": "http://127.0.0.1:2"}}
    with pytest.raises(ConfigError) as err:
        _load(eval_envs=held_out)
    assert "eval_envs ['held'] would never be evaluated: train.eval_every is unset" in str(err.value)
    with caplog.at_level("WARNING", logger="raygrpo.config.run"):
        cfg = _load(eval_envs=held_out, train={"eval_every": 0})  # turning evaluation off on a train config
    assert cfg.train.eval_every == 0
    assert "train.eval_every is 0: eval_envs ['held'] are served but never evaluated" in caplog.text
    assert _load(eval_envs=held_out, train={"eval_every": 5}).train.eval_every == 5


@pytest.mark.parametrize("trainer, says", [
    ({"learnig_rate": 1e-3}, "trainer.learnig_rate: not a GRPOConfig field"),
    ({"generation_batch_size": "abc"}, "trainer.generation_batch_size: expected a number, got 'abc'"),
    ({"per_device_train_batch_size": 0}, "trainer.per_device_train_batch_size: must be a whole number of at least 1"),
    ({"max_steps": -1}, "trainer.max_steps: must be a whole number of at least 1"),
    ({"gradient_accumulation_steps": 1.5}, "trainer.gradient_accumulation_steps: expected a whole number"),
    ({"mask_truncated_completions": "yes please"}, "trainer.mask_truncated_completions: expected true or false"),
    ({"generation_batch_size": 16, "steps_per_generation": 2}, "generation_batch_size and trainer.steps_per_gen"),
    ({"top_p": 0.9}, "trainer.top_p: TRL does not generate in a raygrpo run"),
    ({"top_k": 20}, "raygrpo samples with sampling.*"),
    ({"min_p": 0.1}, "trainer.min_p"),
    ({"repetition_penalty": 1.1}, "trainer.repetition_penalty"),
    ({"generation_kwargs": {"top_k": 5}}, "trainer.generation_kwargs"),
    ({"num_train_epochs": 3}, "trainer.num_train_epochs: raygrpo trains trainer.max_steps optimizer steps"),
    ({"num_train_epochs": 3, "max_steps": 50}, "set trainer.max_steps instead"),
    ({"vllm_importance_sampling_cap": 3.0}, "trainer.vllm_importance_sampling_cap is set by raygrpo from "
                                            "train.off_policy.high"),
    ({"vllm_gpu_memory_utilization": 0.5}, "TRL's colocate vLLM mode, which raygrpo does not run: set "
                                           "policy.vllm.gpu_memory_utilization"),
    ({"vllm_max_model_length": 2048}, "policy.serve.max_model_len"),
    ({"vllm_tensor_parallel_size": 2}, "trainer.vllm_tensor_parallel_size: applies to TRL's colocate"),
    ({"vllm_enable_sleep_mode": True}, "policy.vllm.enable_sleep_mode"),
    ({"vllm_model_impl": "transformers"}, "trainer.vllm_model_impl"),
    ({"vllm_structured_outputs_regex": "[0-9]+"}, "trainer.vllm_structured_outputs_regex: TRL does not generate"),
    ({"max_completion_length": 64}, "trainer.max_completion_length caps nothing in a raygrpo run (raygrpo generates: "
                                    "cap a turn with sampling.max_tokens, a whole rollout with rollout.max_total_tokens"),
    ({"max_completion_length": 64, "loss_type": "dapo"}, "constant divisor of trainer.loss_type dr_grpo's loss, and "
                                                         "loss_type here is 'dapo'"),
    ({"save_only_model": True}, "trainer.save_only_model: a checkpoint without the optimizer, scheduler and RNG states "
                                "would make --resume restart the optimizer"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "trainer.chat_template_kwargs is set by raygrpo from "
                                                           "rollout.chat_template_kwargs"),
    ({"use_transformers_continuous_batching": True}, "trainer.use_transformers_continuous_batching: TRL does not "
                                                     "generate"),
    ({"cache_implementation": "static"}, "trainer.cache_implementation: TRL does not generate"),
    ({"max_tool_calling_iterations": 3}, "trainer.max_tool_calling_iterations: TRL runs no tool calls in a raygrpo "
                                         "run (raygrpo's agent loop does): set rollout.max_turns"),
    ({"shuffle_dataset": False}, "trainer.shuffle_dataset: TRL's dataset here is placeholder prompts"),
])
def test_the_trainer_mapping_is_checked_at_load(trainer, says):
    """Names, types and batch sizes fail when the config loads (exit 2), not in the learner after Ray started."""
    with pytest.raises(ConfigError) as err:
        _load(trainer=trainer)
    assert says in str(err.value)


def test_max_completion_length_is_the_divisor_of_dr_grpo_only():
    """Only `loss_type: dr_grpo` reads it (the loss's constant divisor); elsewhere it would cap nothing."""
    trainer = {"max_completion_length": 64, "loss_type": "dr_grpo"}
    assert _load(trainer=trainer).trainer == trainer


@pytest.mark.parametrize("trainer, every", [
    ({"save_steps": 0.5, "num_iterations": 2, "max_steps": 6}, 3),  # ceil(6 * 0.5) = 3: inside the second batch
    ({"save_steps": 0.3, "num_iterations": 2}, 6),  # raygrpo's max_steps 20: ceil(6.0) = 6 is a batch's end
    ({"save_steps": 0.25, "num_iterations": 2, "max_steps": 10}, 3),  # ceil(2.5)
])
def test_a_fractional_save_steps_is_resolved_as_transformers_does_and_checked(trainer, every):
    """A fraction of the run becomes `ceil(max_steps * fraction)` steps (transformers' `compute_steps`), which must
    end a generation batch (2 optimizer steps here) like a whole number must."""
    if every % 2 == 0:
        assert _load(trainer=trainer).trainer["save_steps"] == trainer["save_steps"]
        return
    with pytest.raises(ConfigError) as err:
        _load(trainer=trainer)
    assert f"trainer.save_steps ({trainer['save_steps']} of trainer.max_steps" in str(err.value)
    assert f"every {every} steps) must be a multiple of the optimizer steps of one generation batch (2)" \
        in str(err.value)


def test_fp16_is_refused_on_a_cpu_learner_naming_both_fields():
    """accelerate skips fp16 on a CPU: the run would train in fp32 while its config says fp16."""
    with pytest.raises(ConfigError) as err:
        _load(trainer={"fp16": True})
    assert "trainer.fp16 needs a GPU learner, but train.learner.num_gpus is 0" in str(err.value)
    assert _load(trainer={"fp16": True}, train={"learner": {"num_gpus": 1}}).trainer["fp16"] is True
    assert _load(trainer={"fp16": False}).trainer["fp16"] is False


def test_a_report_to_integration_without_its_package_fails_before_ray_starts(monkeypatch):
    """`raygrpo train` refuses it in its resolve step (exit 2) instead of the learner failing after the start-up;
    `raygrpo rollout`, which trains nothing, still loads the config."""
    import importlib.util

    from raygrpo.core.errors import ResolveError
    from raygrpo.driver.resolve import resolve_run

    installed = {"mlflow"}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: real("json") if name in installed else None)
    for report_to, says in (("tensorboard", "'tensorboard' needs tensorboard or tensorboardX"),
                            (["mlflow", "wandb"], "'wandb' needs wandb"),
                            (["dagshub"], "'dagshub' needs dagshub, mlflow")):
        cfg = _load(trainer={"report_to": report_to})
        with pytest.raises(ResolveError) as err:
            resolve_run(cfg, train=True)
        assert f"trainer.report_to: {says}, not installed" in str(err.value)
        assert "mlflow'" not in str(err.value).split("needs")[0]
    installed.add("tensorboardX")
    from raygrpo.config.trainer import check_report_to
    for fine in ("tensorboard", ["mlflow"], "none", "all", ["none"]):
        check_report_to({"report_to": fine})


def test_rollout_chat_template_kwargs_leave_the_loops_own_arguments_alone():
    assert _load(rollout={"chat_template_kwargs": {"enable_thinking": False}}).rollout.chat_template_kwargs == {
        "enable_thinking": False}
    with pytest.raises(ConfigError) as err:
        _load(rollout={"chat_template_kwargs": {"add_generation_prompt": False, "tools": []}})
    assert "rollout.chat_template_kwargs" in str(err.value)
    assert "['add_generation_prompt', 'tools'] are set by the agent loop" in str(err.value)


@pytest.mark.parametrize("policy, refused", [
    ({"kind": "transformers"}, True),
    ({"kind": "vllm"}, True),  # engine actors: the weights travel through Ray, not TRL's NCCL group
    ({"kind": "vllm", "url": "http://127.0.0.1:8000"}, False),
])
def test_trls_vllm_server_options_only_where_trl_drives_a_server(policy, refused):
    """`vllm_group_port` / `vllm_server_timeout` reach TRL's VLLMClient only in its server mode."""
    trainer = {"vllm_group_port": 51300, "vllm_server_timeout": 600}
    if not refused:
        assert _load(policy=policy, trainer=trainer).trainer == trainer
        return
    with pytest.raises(ConfigError) as err:
        _load(policy=policy, trainer=trainer)
    for name in trainer:
        assert f"trainer.{name} is read only when TRL drives a vLLM server" in str(err.value)


def test_numeric_trainer_strings_become_numbers_at_load():
    cfg = load_config(data={"envs": URL_ENV}, overrides=["trainer.learning_rate=1e-3", "trainer.max_steps='4'"])
    assert cfg.trainer == {"learning_rate": 0.001, "max_steps": 4}


@pytest.mark.parametrize("sections, says", [
    ({"trainer": {"per_device_train_batch_size": 12}, "rollout": {"group_size": 8}},
     "the generation batch (12 rollouts"),
    ({"trainer": {"generation_batch_size": 24, "per_device_train_batch_size": 8}, "rollout": {"group_size": 16}},
     "must be a multiple of rollout.group_size (16)"),
    ({"rollout": {"group_size": 1}}, "rollout.group_size (1): GRPO needs at least 2 rollouts per group"),
])
def test_a_training_batch_of_partial_groups_fails_before_ray_starts(sections, says):
    """A rollout run trains nothing, so its group size is free; `raygrpo train` refuses it in its resolve step."""
    from raygrpo.core.errors import ResolveError
    from raygrpo.driver.resolve import resolve_run

    cfg = _load(**sections)  # loads: `raygrpo rollout` reads no trainer batch
    with pytest.raises(ResolveError) as err:
        resolve_run(cfg, train=True)  # refused before any environment is listed (its URL is closed)
    assert says in str(err.value)


@pytest.mark.timeout(180)
def test_grpo_config_fields_read_from_trls_source_are_the_dataclass_fields():
    """The load-time check reads the fields without importing TRL (8-10 s); they must be the class's own."""
    import dataclasses

    from raygrpo.config.trl_fields import GRPO_CONFIG, fields_from_source

    parsed = fields_from_source(*GRPO_CONFIG)
    from trl import GRPOConfig

    real = {f.name: str(f.type) for f in dataclasses.fields(GRPOConfig)}
    assert set(parsed) == set(real)
    for name, annotation in parsed.items():
        for word in ("int", "float", "str", "bool", "dict"):
            assert (word in annotation) == (word in real[name]), (name, annotation, real[name])


@pytest.mark.parametrize("train, says", [
    ({"off_policy": {"mode": "mis", "high": 0.4}}, "low (0.5) must be below train.off_policy.high (0.4) for mode "
                                                   "'mis' (low defaults to 0.5 there)"),
    ({"off_policy": {"mode": "tis", "low": 2.5}}, "low (2.5) must be below train.off_policy.high (2) for mode 'tis' "
                                                  "(high defaults to 2 there)"),
    ({"mode": "async", "off_policy": {"low": 2.0}}, "for mode 'tis'"),  # mode unset: async's tis
])
def test_off_policy_bounds_are_ordered_after_their_defaults_are_filled_in(train, says):
    with pytest.raises(ConfigError) as err:
        _load(policy={"kind": "transformers"}, train=train)
    assert says in str(err.value)
    assert _load(train={"off_policy": {"mode": "mis", "high": 0.9}}).train.off_policy.bounds("mis") == (0.5, 0.9)


@pytest.mark.parametrize("policy, value", [(SERVER, False), (SERVER, True), (SCRIPTED, False)])
def test_behaviour_ratio_is_refused_either_way_without_engine_actors(policy, value):
    """`false` with a vLLM server used to leave TRL's tis correction on, silently."""
    with pytest.raises(ConfigError) as err:
        _load(policy=policy, train={"behaviour_ratio": value})
    assert "train.behaviour_ratio needs the sampling log-probs of engine actors" in str(err.value)
    if policy is SERVER:
        assert "which train.off_policy.mode sets; none turns it off" in str(err.value)


def test_fields_of_another_mode_are_refused_where_set():
    with pytest.raises(ConfigError, match=r"train.max_staleness \(2\) bounds the groups async mode consumes"):
        _load(train={"mode": "sync", "max_staleness": 2})
    assert _load(train={"mode": "async", "max_staleness": 2}).train.max_staleness == 2
    for policy in (SERVER, SCRIPTED):
        with pytest.raises(ConfigError, match="train.weight_sync_every sets how often the learner pushes"):
            _load(policy=policy, train={"weight_sync_every": 2})
    assert _load(train={"weight_sync_every": 2}).train.weight_sync_every == 2  # transformers engine actors


@pytest.mark.parametrize("sections, field", [
    ({"workers": {"idle_timeout_s": 5}}, "workers.idle_timeout_s"),
    ({"workers": {"min_env_actors": 2, "max_env_actors": 2, "idle_timeout_s": 5}}, "workers.idle_timeout_s"),
    ({"envs": {"e": {**URL_ENV["e"], "pool": {"num_actors": 2, "idle_timeout_s": 5}}}}, "envs.e.pool.idle_timeout_s"),
    ({"envs": {"e": {**URL_ENV["e"], "pool": {"min_actors": 3, "idle_timeout_s": 5}}}}, "envs.e.pool.idle_timeout_s"),
    ({"envs": {"e": {**URL_ENV["e"], "pool": {"num_actors": 2}}},
      "workers": {"min_env_actors": 0, "max_env_actors": 4, "idle_timeout_s": 5}}, "workers.idle_timeout_s"),
])
def test_an_idle_timeout_on_a_fixed_pool_is_refused(sections, field):
    with pytest.raises(ConfigError) as err:
        load_config(data={"envs": URL_ENV, **sections})
    assert f"{field} drains idle actors" in str(err.value)


def test_an_idle_timeout_is_accepted_where_an_elastic_pool_reads_it():
    with pytest.raises(ConfigError, match="workers.idle_timeout_s drains idle actors"):
        load_config(data={"envs": URL_ENV, "workers": {"idle_timeout_s": 5}})
    assert load_config(data={"envs": URL_ENV, "workers": {"max_env_actors": 4, "idle_timeout_s": 5}})
    elastic = {**URL_ENV["e"], "pool": {"min_actors": 0, "max_actors": 3}}
    cfg = load_config(data={"envs": {"e": elastic}, "workers": {"idle_timeout_s": 5}})  # the pool's default
    assert cfg.workers.idle_timeout_s == 5
    assert load_config(data={"envs": {"e": {**elastic, "pool": {"max_actors": 3, "idle_timeout_s": 2}}}})


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
