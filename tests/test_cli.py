"""The `raygrpo` command as a user runs it: exit codes, Ctrl-C, and secrets that must not leak.

Each test runs the CLI in a subprocess with its own local Ray, against an ORS server in the test process whose own
session registry is the leak check.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e_support import FlakyEnvironment, NapEnvironment
from tests.ors_utils import SecretEnvironment, closed_port, ors_server, wait_until

SUPPORT = str(Path(__file__).with_name("e2e_support.py"))
FAKE_SECRET = "sk-fake-raygrpo-7f3a9c1e"


def _write_config(path: Path, body: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(body))
    return path


#: CLI processes the current test started; whatever still runs when it ends is killed with all it started.
_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_cli_left_behind():
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in tree:  # the driver, and Ray's processes under it (raylet, gcs, workers)
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            psutil.wait_procs(tree, timeout=20)


def _cli(args: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "raygrpo.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, start_new_session=True, **kwargs,
    )
    _started.append(proc)
    return proc


@pytest.mark.timeout(60)
def test_bad_config_key_exits_2_naming_the_field(tmp_path):
    proc = _cli(["rollout", "examples/echo/rollout.yaml", "--out", str(tmp_path), "--set", "rollout.max_turnz=3"])
    out, err = proc.communicate(timeout=50)
    assert proc.returncode == 2
    assert "rollout.max_turnz" in err and "Extra inputs are not permitted" in err


def _run_folder(path: Path) -> Path:
    """A training run's folder, its model saved under `model/`: what `model:` is often given instead of that."""
    (path / "model").mkdir(parents=True)
    (path / "summary.json").write_text("{}")
    for name in ("config.json", "tokenizer.json"):
        (path / "model" / name).write_text("{}")
    return path


@pytest.mark.parametrize("case, field, cause", [
    ("missing file", "envs.echo.environment", "does not exist"),
    ("missing class", "envs.echo.environment", "has no attribute 'Nope'"),
    ("not an Environment", "envs.echo.environment", "is not an openreward.environments.Environment subclass"),
    ("missing policy function", "policy.script", "has no attribute 'nope'"),
    ("missing task folder", "envs.tasks.path", "does not exist"),
    ("run folder for its model", "model", "it holds a model folder at"),
    ("policy url without a scheme", "policy.url", "is not an http(s) URL"),
    ("policy server down", "policy.url", "cannot reach the vLLM server"),
])
@pytest.mark.timeout(90)
def test_what_a_config_names_is_resolved_before_ray_starts(tmp_path, case, field, cause):
    """Exit 2 with one line that names the field, and no Ray session was started for it."""
    echo = Path("examples/echo").resolve()
    overrides = {
        "missing file": ["envs.echo.environment=no_such_env.py:EchoEnvironment"],
        "missing class": [f"envs.echo.environment={echo}/env.py:Nope"],
        "not an Environment": [f"envs.echo.environment={echo}/env.py:TRAIN_TARGETS"],
        "missing policy function": [f"policy.script={echo}/policies.py:nope"],
        "missing task folder": ["envs.tasks.kind=harbor", f"envs.tasks.path={tmp_path}/no-such-suite"],
        "run folder for its model": [f"model={_run_folder(tmp_path / 'echo-train')}"],
        "policy url without a scheme": ["policy.kind=vllm", "policy.script=null", "policy.url=127.0.0.1:8000"],
        "policy server down": ["policy.kind=vllm", "policy.script=null", f"policy.url=http://127.0.0.1:{closed_port()}"],
    }[case]
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg-", dir="/tmp"))  # where a Ray started by this run would write
    started = time.monotonic()
    proc = _cli(["rollout", "examples/echo/rollout.yaml", "--out", str(tmp_path / "out"),
                 *[a for o in overrides for a in ("--set", o)]], env={"RAY_TMPDIR": str(ray_tmp)})
    out, err = proc.communicate(timeout=80)
    elapsed = time.monotonic() - started
    print(f"\n{case}: exit {proc.returncode} in {elapsed:.1f} s: {err.strip()}")
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"raygrpo: {field}: ") and cause in lines[0], err
    assert list(ray_tmp.iterdir()) == []  # no Ray session was started
    ray_tmp.rmdir()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
@pytest.mark.timeout(300)
def test_a_signal_keeps_finished_trajectories_and_closes_every_session(tmp_path, sig, code):
    """Ctrl-C, and SIGTERM as `ray job stop` and `kill` send it (with Ray initialised in the driver): a partial
    summary with `interrupted: true`, the exit code of the signal, and the server's own session count back to 0."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        config = _write_config(tmp_path / "nap.yaml", {
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 12}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_by_task"},
            "rollout": {"group_size": 1},
            "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 12},
            "ray": {"num_cpus": 2},
        })
        out = tmp_path / "run"
        # As from a terminal: SIGINT at its default even where this pytest was started in the background by a
        # non-interactive shell (which ignores SIGINT for it and, through it, for the CLI: Python then never raises
        # KeyboardInterrupt, and the run naps its minute out).
        proc = _cli(["rollout", str(config), "--out", str(out), "--no-progress"],
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            # Tasks 0-3 finish quickly; the others nap for a minute. Interrupt once the quick ones are written.
            lines = lambda: (out / "trajectories.jsonl").read_text().count("\n") if (out / "trajectories.jsonl").exists() else 0  # noqa: E731
            ready = wait_until(lambda: (lines() >= 4 and NapEnvironment.napping == 8) or proc.poll() is not None, 150)
            if not ready or proc.poll() is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                _, err = proc.communicate(timeout=30)
                pytest.fail(f"run not in the expected state: {lines()} lines, {NapEnvironment.napping} naps; {err[-3000:]}")
            # The CLI alone gets the signal, as from `kill` or `ray job stop` (not its whole process group).
            os.kill(proc.pid, sig)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == code, err
        assert "SIGTERM received" not in err and "interrupted; partial results in" in err
        assert wait_until(lambda: server.live_sessions() == 0, 15), server.live_sessions()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["completed"] == 4 and summary["requested"] == 12
    assert summary["status_counts"] == {"ok": 4, "cancelled": 8}
    assert summary["leaked_envs"] == 0
    assert NapEnvironment.live == 0


@pytest.mark.timeout(300)
def test_a_ctrl_c_keeps_the_finished_rollouts_of_unfinished_groups(tmp_path):
    """A group's rollouts go to an actor in one call, which Ctrl-C cancels whole: the rollouts of it that had
    finished are still written and counted, only the running ones are cancelled."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        config = _write_config(tmp_path / "nap.yaml", {
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 4}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_every_other"},
            "rollout": {"group_size": 2},
            "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 8},
            "ray": {"num_cpus": 2},
        })
        out = tmp_path / "run"
        proc = _cli(["rollout", str(config), "--out", str(out), "--no-progress"],
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            ready = wait_until(lambda: (NapEnvironment.napping == 4 and NapEnvironment.live == 4)
                               or proc.poll() is not None, 150)  # 4 finished (closed), 4 napping
            if not ready or proc.poll() is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"run not in the expected state: {NapEnvironment.napping} naps; "
                            f"{proc.communicate(timeout=30)[1][-3000:]}")
            os.kill(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"] == {"ok": 4, "cancelled": 4} and summary["completed"] == 4, summary
    assert (out / "trajectories.jsonl").read_text().count("\n") == 4


@pytest.mark.timeout(300)
def test_an_interrupted_train_closes_its_sessions_before_the_learner_is_killed(tmp_path):
    """Ctrl-C of `raygrpo train`: the learner's env pools close their ORS sessions (the kill of the learner that
    follows takes its pool actors with it, running no `shutdown`), and the partial summary says what is known."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        config = _write_config(tmp_path / "nap-train.yaml", {
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 12}},
            "model": "tiny",
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_by_task"},
            "rollout": {"group_size": 2},
            "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 12},
            "trainer": {"per_device_train_batch_size": 4, "max_steps": 3, "save_steps": 100},
            "ray": {"num_cpus": 2},
        })
        out = tmp_path / "run"
        proc = _cli(["train", str(config), "--out", str(out), "--no-progress"],
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            if not wait_until(lambda: NapEnvironment.napping >= 2 or proc.poll() is not None, 200) or proc.poll():
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"no rollout napping: {proc.communicate(timeout=30)[1][-3000:]}")
            os.kill(proc.pid, signal.SIGINT)
            stdout, err = proc.communicate(timeout=150)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130, err
        assert wait_until(lambda: server.live_sessions() == 0, 15), server.live_sessions()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["leaked_envs"] == 0
    assert isinstance(summary["steps"], int) and "status_counts" in summary and "scored" in summary, summary
    assert "{'loss'" not in stdout


@pytest.mark.timeout(180)
def test_a_run_where_every_rollout_failed_exits_1_with_its_causes(tmp_path):
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        config = _write_config(tmp_path / "broken.yaml", {
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 4}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:broken"},
            "rollout": {"group_size": 1},
            "workers": {"num_env_actors": 1},
            "ray": {"num_cpus": 2},
        })
        # A previous run with the same --out, killed while writing its last line: this run starts anew.
        run = tmp_path / "run"
        run.mkdir()
        (run / "trajectories.jsonl").write_text('{"old": 1}\n{"old": 2}\n{"old": 3, "cut')
        (run / "metrics.jsonl").write_text('{"kind": "pools", "old": true}\n')
        proc = _cli(["rollout", str(config), "--out", str(run), "--no-progress"])
        out, err = proc.communicate(timeout=150)
    assert proc.returncode == 1, err
    assert "raygrpo: the run failed: no rollout was scored and 4 of 4 failed" in err
    assert "status: policy_error 4" in out and "top failure causes:" in out
    cause = next(line for line in out.splitlines() if "no answer today" in line and "e.g." not in line)
    assert cause.split()[:2] == ["4", "policy_error"]
    assert json.loads((run / "summary.json").read_text())["failure_causes"][0]["count"] == 4
    lines = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(line["status"] == "policy_error" for line in lines)
    assert all("old" not in json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
    assert f"{run / 'trajectories.jsonl'} holds 3 line(s) of a previous run" in err


@pytest.mark.timeout(180)
def test_one_failure_in_many_still_exits_0(tmp_path):
    """One session of eight dies and is not retried: 1/8 is within the default fail_fraction (0.25)."""
    FlakyEnvironment.sessions_by_task.clear()
    with ors_server(FlakyEnvironment) as server:
        config = _write_config(tmp_path / "flaky.yaml", {
            "envs": {"flaky": {"kind": "ors", "url": server.url, "indices": [0]}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:call_answer"},
            "rollout": {"group_size": 8},
            "workers": {"num_env_actors": 1, "max_retries": 0},
            "ray": {"num_cpus": 2},
        })
        proc = _cli(["rollout", str(config), "--out", str(tmp_path / "run"), "--no-progress"])
        out, err = proc.communicate(timeout=150)
        FlakyEnvironment.sessions_by_task.clear()
        strict = _cli(["rollout", str(config), "--out", str(tmp_path / "strict"), "--no-progress",
                       "--set", "fail_fraction=0.1"])
        _, strict_err = strict.communicate(timeout=150)
    assert proc.returncode == 0, err
    assert "status: ok 7, env_error 1" in out and "the session is gone" in out
    assert strict.returncode == 1 and "1 of 8 rollouts failed, more than fail_fraction=0.1" in strict_err


@pytest.mark.timeout(240)
def test_a_learner_that_fails_reports_its_cause_in_one_line(tmp_path):
    """The learner fails building its trainer (a value only TRL checks: an unknown scheduler): exit 1, one line."""
    proc = _cli(["train", "examples/echo/train.yaml", "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", "trainer.lr_scheduler_type=bogus", "--set", "train.eval_every=0",
                 "--set", "workers.num_env_actors=1"])
    out, err = proc.communicate(timeout=220)
    assert proc.returncode == 1, err
    [line] = [ln for ln in err.splitlines() if ln.startswith("raygrpo: ")]
    assert "trainer: GRPOConfig rejected the settings" in line and "bogus is not a valid SchedulerType" in line
    assert line.endswith("(run with -v for the traceback)")
    assert "Traceback" not in err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["interrupted"] is False


@pytest.mark.parametrize("override, says", [
    ("trainer.learnig_rate=1e-3", "trainer.learnig_rate: not a GRPOConfig field"),
    ("trainer.top_p=0.9", "trainer.top_p: TRL does not generate in a raygrpo run"),
    ("trainer.per_device_train_batch_size=0", "trainer.per_device_train_batch_size: must be a whole number"),
    ("trainer.per_device_train_batch_size=12", "the generation batch (12 rollouts"),  # groups of 8
    ("trainer.save_only_model=true", "trainer.save_only_model: a checkpoint without the optimizer"),
    ("trainer.max_completion_length=64", "trainer.max_completion_length caps nothing in a raygrpo run"),
    ("trainer.chat_template_kwargs={enable_thinking: false}", "from rollout.chat_template_kwargs"),
    ("trainer.fp16=true", "trainer.fp16 needs a GPU learner, but train.learner.num_gpus is 0"),
    ("trainer.save_steps=0.5", "trainer.save_steps (0.5 of trainer.max_steps 6: every 3 steps) must be a multiple"),
    ("trainer.report_to=[tensorboard]", "trainer.report_to: 'tensorboard' needs tensorboard or tensorboardX"),
])
@pytest.mark.timeout(90)
def test_a_bad_trainer_mapping_exits_2_before_ray_starts(tmp_path, override, says):
    """docs/statuses.md: a bad config exits 2 before Ray starts; the `trainer:` mapping used to fail in the learner
    actor, after Ray, the servers and the pools had started (exit 1)."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg-", dir="/tmp"))  # where a Ray started by this run would write
    more = ["--set", "trainer.max_steps=6", "--set", "trainer.num_iterations=2"] if "save_steps" in override else []
    if "report_to" in override:
        assert importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None
    proc = _cli(["train", "examples/echo/train.yaml", "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", override, *more], env={"RAY_TMPDIR": str(ray_tmp)})
    out, err = proc.communicate(timeout=80)
    assert proc.returncode == 2, err
    assert err.startswith("raygrpo: ") and says in err and "Traceback" not in err, err
    assert list(ray_tmp.iterdir()) == []  # no Ray session was started
    ray_tmp.rmdir()


@pytest.mark.timeout(90)
def test_resume_without_a_complete_checkpoint_exits_2_naming_the_folder(tmp_path):
    """A run killed inside its only save left a checkpoint without trainer_state.json and raygrpo_state.json:
    `--resume` stops before Ray starts, naming the folder, instead of crashing in the learner on every try."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg-", dir="/tmp"))
    cut = tmp_path / "run" / "checkpoints" / "checkpoint-10"
    cut.mkdir(parents=True)
    (cut / "model.safetensors").write_bytes(b"")  # the model and optimizer came first; the kill came then
    proc = _cli(["train", "examples/echo/train.yaml", "--out", str(tmp_path / "run"), "--no-progress", "--resume"],
                env={"RAY_TMPDIR": str(ray_tmp)})
    out, err = proc.communicate(timeout=80)
    assert proc.returncode == 2, err
    assert err.startswith("raygrpo: --resume: no complete checkpoint under ") and str(cut.parent) in err, err
    assert "checkpoint-10 lacks trainer_state.json, raygrpo_state.json" in err and "Traceback" not in err, err
    assert list(ray_tmp.iterdir()) == []  # no Ray session was started
    ray_tmp.rmdir()


@pytest.mark.timeout(90)
def test_check_refuses_a_json_path_it_cannot_write_before_the_check(tmp_path):
    """`raygrpo check ... --json DIR` used to run the whole check, then crash with IsADirectoryError."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg-", dir="/tmp"))
    (tmp_path / "results").mkdir()
    (tmp_path / "file").write_text("")
    for target, says in [(tmp_path / "results", "is a folder; give a file name"),
                         (tmp_path / "file" / "check.json", "is not a folder")]:
        proc = _cli(["check", "examples/harbor_local/tasks", "--json", str(target), "--no-progress"],
                    env={"RAY_TMPDIR": str(ray_tmp)})
        out, err = proc.communicate(timeout=40)
        assert proc.returncode == 2, err
        assert err.strip().startswith(f"raygrpo: --json {target}: ") and says in err, err
    assert list(ray_tmp.iterdir()) == []  # the check never started
    ray_tmp.rmdir()


@pytest.mark.timeout(180)
def test_exported_secret_reaches_the_environment_and_nowhere_else(tmp_path, request):
    SecretEnvironment.received.clear()
    # Ray's own temp dir (its session logs), short enough for the Unix socket paths inside it.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    with ors_server(SecretEnvironment) as server:
        config = _write_config(tmp_path / "secret.yaml", {
            "envs": {"vault": {"kind": "ors", "url": server.url, "secrets": {"probe_token": "RAYGRPO_TEST_SECRET"}}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:call_check"},
            "rollout": {"group_size": 2},
            "workers": {"num_env_actors": 1},
            "ray": {"num_cpus": 2},
        })
        out = tmp_path / "run"
        proc = _cli(["-v", "rollout", str(config), "--out", str(out), "--no-progress"],
                    env={"RAYGRPO_TEST_SECRET": FAKE_SECRET, "RAY_TMPDIR": str(ray_tmp)})
        stdout, stderr = proc.communicate(timeout=150)
        assert proc.returncode == 0, stderr
    assert json.loads((out / "summary.json").read_text())["reward_mean"] == 1.0
    assert SecretEnvironment.received and all(r.get("probe_token") == FAKE_SECRET for r in SecretEnvironment.received)
    assert FAKE_SECRET not in stdout and FAKE_SECRET not in stderr
    searched = 0
    for root in (out, ray_tmp):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                searched += 1
                assert FAKE_SECRET.encode() not in path.read_bytes(), path
    assert searched > 5  # the run dir and Ray's session logs were really there


#: What Ray 2.60's `ActorDiedError` says when an actor's constructor raised (its message is all it keeps).
CREATION_FAILED = (
    "The actor died because of an error raised in its creation task, \x1b[36mray::VLLMEngineActor.__init__()\x1b[39m "
    "(pid=5366, ip=192.0.2.2, actor_id=2dc6d8d15294fc16114ea9c101000000, repr=<VLLMEngineActor object at 0x7f65>)\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/x/raygrpo/policy/vllm_engine.py", line 169, in __init__\n'
    "    self.engine = LLMEngine.from_engine_args(engine_args(model_path, max_num_seqs, seed, engine_kwargs or {}))\n"
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
    "dtype\n  Input should be 'auto', 'half', 'float16', 'bfloat16', 'float' or 'float32' [type=literal_error]"
)


@pytest.mark.timeout(30)
def test_the_one_line_error_keeps_the_fix_and_an_actors_creation_error(capsys):
    """The CLI's line is not just a message's first line: the fix that Ray announces with "To fix this, either:",
    and for an actor whose constructor raised, what it raised instead of Ray's line about the actor's pid."""
    from ray.exceptions import ActorDiedError, RayActorError

    from raygrpo.cli.app import _guarded

    def fails(exc: BaseException):
        def work():
            raise exc
        return work

    ray_says = ("Invalid Ray address: 'http://127.0.0.1:8265'. It looks like you set RAY_ADDRESS to an HTTP address "
                "(e.g. the API server address). To fix this, either:\n  1. Unset RAY_ADDRESS if you are running from "
                "a Ray node, or\n  2. Set RAY_ADDRESS to the GCS address instead (e.g. <head_node_ip>:6379).")
    assert _guarded(fails(ValueError(ray_says)), verbose=False, interrupted="") == (None, 1)
    err = capsys.readouterr().err
    assert "To fix this, either: 1. Unset RAY_ADDRESS" in err and "2. Set RAY_ADDRESS to the GCS address" in err
    assert len(err.strip().splitlines()) == 1

    died = ActorDiedError()
    RayActorError.__init__(died, "2dc6d8", CREATION_FAILED, actor_init_failed=True)
    assert _guarded(fails(died), verbose=False, interrupted="") == (None, 1)
    err = capsys.readouterr().err
    assert err.startswith("raygrpo: ActorDiedError: VLLMEngineActor.__init__() raised pydantic_core._pydantic_core"
                          ".ValidationError: 1 validation error for ModelConfig dtype Input should be 'auto'"), err
    assert "pid=" not in err and len(err.strip().splitlines()) == 1
