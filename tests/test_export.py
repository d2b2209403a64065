"""`raygrpo export`: a run's trajectories as Parquet, a Hugging Face dataset and Harbor ATIF files.

The inputs are written by raygrpo's own code: the agent loop (`run_rollout`, no Ray) with a scripted policy and the
tiny model's tokenizer against small in-process environments shaped like Harbor's (bash, a verifier with evidence
and logs, a reference solution for the oracle) and ORS's (a `@terminal` answer, per-call rewards), written by the
run's writers (`TrajectoryWriter` for a rollout run, `RolloutLog` for a training run). Round trips compare every
field of every line.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.base import EnvError
from raygrpo.export import ExportError, ExportFormat, ExportOptions, decode_row, export_run, tables
from raygrpo.export.schema import SCHEMA_VERSION, TIMING_KEYS, trajectory_codec
from raygrpo.export.tables import read_parquet
from raygrpo.policy.acting import OraclePolicy
from raygrpo.policy.base import GenerationContext, SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.agent.rollout import PROVISION_PARTS, run_rollout
from raygrpo.driver.summary import TrajectoryWriter
from raygrpo.agent.toolcalls import format_tool_call
from raygrpo.train.metrics import RolloutLog
from raygrpo.core.types import ANSWER_STEP, SOLUTION_STEP, TRAJECTORY_SCHEMA_VERSION, Observation, TaskRef, ToolResult


def _tool(name: str, argument: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {argument: {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": parameters}}


BASH = _tool("bash", "command")
LOOKUP = _tool("lookup", "key")


class ShellEnv:
    """Harbor-shaped: a `bash` tool, a verifier that leaves evidence (and logs the writer moves to files), a reference
    solution for the oracle, a sandbox's provenance and start timings."""

    def __init__(self, solved_by: str = "echo fixed") -> None:
        self.solved_by = solved_by
        self.solved = False
        self.verifier: dict[str, Any] | None = None
        self.provenance = "cold"
        self.timings = {"start": 0.012, "governor_wait": 0.0}

    async def start(self, task: TaskRef) -> Observation:
        return Observation(messages=[{"role": "user", "content": f"Fix `{task.metadata['task_name']}` — ünïcode."}],
                           tools=[BASH])

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        command = arguments.get("command", "")
        self.solved = self.solved or command == self.solved_by
        return ToolResult(f"$ {command}\n[exit code 0]", metadata={"exit_code": 0, "cwd": "/app"})

    async def run_solution(self) -> ToolResult:
        self.solved = True
        return ToolResult("fixed\n[exit code 0]", finished=True,
                          metadata={"exit_code": 0, "output_tail": "fixed\n", "script": "/solution/solve.sh"})

    async def score(self) -> float | None:
        reward = 1.0 if self.solved else 0.0
        self.verifier = {"exit_code": 0, "output_tail": "1 passed\n", "rewards": {"reward": reward, "style": 0.5},
                         "logs": {"verifier/test-stdout.txt": "1 passed\n"}}
        return reward

    async def close(self) -> None:
        pass


class AnswerEnv:
    """ORS-shaped: a `lookup` tool with an intermediate reward, and a `@terminal` tool that scores a final answer."""

    async def start(self, task: TaskRef) -> Observation:
        return Observation(messages=[{"role": "user", "content": "What is the value of `x`? Answer with it."}],
                           tools=[LOOKUP])

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("x = 42", reward=0.1, metadata={"source": "table", "rows": [1, 2]})

    async def answer(self, content: str) -> ToolResult:
        return ToolResult("correct", reward=1.0, finished=True, metadata={"graded": "42" in content})

    async def score(self) -> float | None:
        return 1.0

    async def close(self) -> None:
        pass


class BrokenEnv(ShellEnv):
    async def start(self, task: TaskRef) -> Observation:
        raise EnvError("sandbox failed to start: out of capacity")


def _script(*turns: str):
    def script(ctx: GenerationContext) -> str:
        return turns[min(ctx.turn, len(turns) - 1)]

    return script


@pytest.fixture(scope="module")
def renderer():
    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.policy.tiny import build_tokenizer

    return ChatRenderer(build_tokenizer())


def _harbor_task(index: int) -> TaskRef:
    return TaskRef(env="local", index=index, metadata={"task_name": f"raygrpo/task-{index}",
                                                         "task_dir": f"/tasks/task-{index}"})


def _trajectories(renderer) -> list:
    """One of each kind of episode, from the real agent loop."""
    bash = format_tool_call
    runs = [
        # Harbor, clean: one call, then done (results pair one to one with the environment's steps).
        (_harbor_task(0), ShellEnv(), _script(bash("bash", {"command": "echo fixed"}), "Done."), {}),
        # Harbor, messy: a call and a malformed one in a turn, then an unknown tool (refused) and a call.
        (_harbor_task(1), ShellEnv(), _script(
            bash("bash", {"command": "ls -la"}) + "<tool_call>{not json</tool_call>",
            bash("python", {"code": "1"}) + bash("bash", {"command": "echo fixed"}),
            "All done."), {"system_prompt": "You are careful."}),
        # Harbor, cut off by the turn limit: the last tool results follow the last turn.
        (_harbor_task(2), ShellEnv(), _script(bash("bash", {"command": "true"})), {"max_turns": 2}),
        # ORS: a call with an intermediate reward, then a final answer a @terminal tool scores.
        (TaskRef(env="qa", index=3, split="test", metadata={"x": {"nested": [1, None]}}), AnswerEnv(),
         _script(bash("lookup", {"key": "x"}), "It is 42."), {}),
        # An environment that never started: no messages.
        (_harbor_task(4), BrokenEnv(), _script("unused"), {}),
    ]
    out = []
    for number, (task, env, script, limits) in enumerate(runs):
        policy = ScriptedPolicy(renderer.tokenizer, script)
        traj = asyncio.run(run_rollout(task, env, policy, renderer, SamplingParams(max_tokens=256),
                                       RolloutConfig(**limits)))
        traj.group_id, traj.sample, traj.worker, traj.node = f"{task.env}:train:{task.index}:ab12", number, "w0", "n0"
        traj.env_span = (1_800_000_000.25 + number, 1_800_000_001.5 + number)
        out.append(traj)
    oracle = asyncio.run(run_rollout(_harbor_task(5), ShellEnv(), OraclePolicy(), None, SamplingParams(),
                                     RolloutConfig()))
    oracle.group_id = "local:train:5:cd34"
    return [*out, oracle]


@pytest.fixture(scope="module")
def rollout_run(tmp_path_factory, renderer) -> Path:
    """A rollout run folder: `trajectories.jsonl` written by `TrajectoryWriter` (verifier logs moved to files)."""
    run = tmp_path_factory.mktemp("rollout-run")
    writer = TrajectoryWriter(run / "trajectories.jsonl")
    for traj in _trajectories(renderer):
        writer.write(traj)
    writer.close()
    return run


@pytest.fixture(scope="module")
def training_run(tmp_path_factory, renderer) -> Path:
    """A training run folder: `rollouts.jsonl` written by `RolloutLog`, two steps of the same episodes."""
    run = tmp_path_factory.mktemp("training-run")
    log = RolloutLog(run / "rollouts.jsonl")
    for step in (1, 2):
        for traj in _trajectories(renderer):
            log.write(traj, step)
    log.close()
    return run


@pytest.fixture
def cli(monkeypatch, capsys):
    """`raygrpo.cli.main` in this process; its SIGTERM handler is put back afterwards."""
    from raygrpo import cli as cli_module

    previous = signal.getsignal(signal.SIGTERM)

    def run(*args: str) -> tuple[int, str, str]:
        code = cli_module.main(["export", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    yield run
    signal.signal(signal.SIGTERM, previous)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.timeout(60)
def test_the_schema_has_a_column_for_every_field_of_the_trajectory_line():
    from raygrpo.core.types import Trajectory

    assert SCHEMA_VERSION == TRAJECTORY_SCHEMA_VERSION, "the line's fields changed: update raygrpo/export/schema.py"
    names = [key.name for key in trajectory_codec(training=False).keys]
    assert names == list(Trajectory(task=TaskRef(env="e", index=0)).to_dict())
    assert [key.name for key in trajectory_codec(training=True).keys] == ["step", *names]
    assert set(PROVISION_PARTS) | {"provision", "generate", "tools", "verify", "total"} == set(TIMING_KEYS)


@pytest.mark.timeout(120)
def test_a_rollout_run_round_trips_through_parquet_pandas_and_a_hf_dataset(rollout_run, tmp_path):
    import datasets
    import pandas as pd

    lines = _lines(rollout_run / "trajectories.jsonl")
    assert len(lines) == 6 and {line["status"] for line in lines} >= {"ok", "truncated", "env_error"}
    assert any(line["verifier"] and line["verifier"].get("logs_dir") for line in lines)

    report = export_run(ExportOptions(path=rollout_run, format=ExportFormat.PARQUET))
    assert report.out == rollout_run / "trajectories.parquet" and report.written == report.lines == 6
    assert list(read_parquet(report.out)) == lines

    frame = pd.read_parquet(report.out)
    assert list(frame.columns[:3]) == ["schema_version", "task", "prompt_ids"] and "step" not in frame.columns
    for row, line in zip(frame.itertuples(), lines):
        assert row.prompt_ids.tolist() == line["prompt_ids"] and row.env_mask.tolist() == line["env_mask"]
        assert row.logprobs.tolist() == line["logprobs"] and row.task["index"] == line["task"]["index"]
        assert row.timings["total"] == line["timings"]["total"]
        assert (row.reward == line["reward"]) or (pd.isna(row.reward) and line["reward"] is None)
    assert frame["status"].value_counts()["ok"] == sum(line["status"] == "ok" for line in lines)

    hf = export_run(ExportOptions(path=rollout_run, format=ExportFormat.HF, out=tmp_path / "hf"))
    dataset = datasets.load_from_disk(str(hf.out))
    assert dataset.num_rows == 6 and [decode_row(row) for row in dataset] == lines
    via_parquet = datasets.load_dataset("parquet", data_files=str(report.out), split="train",
                                        cache_dir=str(tmp_path / "cache"))
    assert [decode_row(row) for row in via_parquet] == lines


@pytest.mark.timeout(120)
def test_a_training_run_round_trips_with_its_step(training_run, tmp_path):
    import datasets

    lines = _lines(training_run / "rollouts.jsonl")
    assert [line["step"] for line in lines] == [1] * 6 + [2] * 6

    report = export_run(ExportOptions(path=training_run, format=ExportFormat.PARQUET))
    assert report.out == training_run / "rollouts.parquet"
    assert list(read_parquet(report.out)) == lines
    hf = export_run(ExportOptions(path=training_run, format=ExportFormat.HF))
    dataset = datasets.load_from_disk(str(hf.out))
    assert dataset.column_names[0] == "step" and dataset["step"] == [1] * 6 + [2] * 6
    assert [decode_row(row) for row in dataset] == lines


@pytest.mark.timeout(60)
def test_lines_of_other_shapes_round_trip_through_the_extra_columns(rollout_run, tmp_path):
    """What a typed column cannot hold goes to `_extra` and comes back: any line round-trips."""
    base = _lines(rollout_run / "trajectories.jsonl")[0]
    odd = []
    line = json.loads(json.dumps(base))
    line["messages"][0]["content"] = [{"type": "text", "text": "parts"}]  # content of another type
    line["messages"][1]["reasoning_content"] = "hmm"  # a key the schema does not name
    line["messages"][2]["name"] = None  # an optional key present as null
    line["messages"][1]["tool_calls"][0]["id"] = "call_0"  # a tool call of another shape
    line["timings"]["queue_wait"] = 0.5  # an unknown timing
    line["reward"] = 1  # an int where floats are
    line["steps"].append({"tool": "bash", "reward": None, "finished": False, "metadata": None, "extra": 1})
    line["verifier"]["exit_code"] = None
    line["verifier"]["probe"] = {"missing": ["pytest"]}
    line["new_field"] = {"from": "a newer writer"}
    odd.append(line)
    older = json.loads(json.dumps(base))
    older["schema_version"] = 4
    del older["sandbox"], older["messages"][0]["content"]  # an older writer's line, and a message without content
    odd.append(older)
    source = tmp_path / "odd.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in odd))

    report = export_run(ExportOptions(path=source, format=ExportFormat.PARQUET))
    assert report.written == 2 and report.older_schema == 4 and "older schema_version 4" in report.notes()[0]
    back = list(read_parquet(report.out))
    assert back == odd
    assert "sandbox" not in back[1] and "content" not in back[1]["messages"][0]
    assert back[0]["messages"][2]["name"] is None and isinstance(back[0]["reward"], float)


@pytest.mark.timeout(60)
def test_decode_row_takes_pandas_rows(rollout_run, tmp_path):
    """pandas reads a null string as NaN and a list as a numpy array: `decode_row` of its rows is the JSON line all
    the same, for the runs' lines and for lines of other shapes (`_extra`, an older line, a null step reward)."""
    import pandas as pd

    base = _lines(rollout_run / "trajectories.jsonl")
    odd = json.loads(json.dumps(base[0]))
    odd["messages"][1]["reasoning_content"] = "hmm"
    odd["step_rewards"] = [1.0, None, 0.5]
    odd["logprobs"][0] = float("-inf")
    older = json.loads(json.dumps(base[1]))
    older["schema_version"] = 4
    del older["sandbox"]
    lines = [*base, odd, older]
    source = tmp_path / "trajectories.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = export_run(ExportOptions(path=source, format=ExportFormat.PARQUET))
    frame = pd.read_parquet(report.out)
    assert [decode_row(frame.iloc[i].to_dict()) for i in range(len(frame))] == lines
    assert [decode_row(row) for row in frame.to_dict("records")] == lines
    decoded = decode_row(frame.iloc[0].to_dict())
    assert type(decoded["prompt_ids"]) is list and type(decoded["prompt_ids"][0]) is int
    assert type(decoded["turns"]) is int and type(decoded["logprobs"][0]) is float


@pytest.mark.timeout(60)
def test_parquet_is_written_a_row_group_at_a_time(rollout_run, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(tables, "BATCH_ROWS", 4)
    source = tmp_path / "trajectories.jsonl"
    lines = _lines(rollout_run / "trajectories.jsonl") * 3  # 18 lines: row groups of 4, 4, 4, 4, 2
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = export_run(ExportOptions(path=tmp_path, format=ExportFormat.PARQUET))
    meta = pq.ParquetFile(report.out).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [4, 4, 4, 4, 2]
    assert pq.read_schema(report.out).metadata[b"raygrpo.kind"] == b"rollout"
    assert list(read_parquet(report.out)) == lines


def _atif(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.timeout(120)
def test_atif_files_validate_with_harbors_models_and_map_each_episode(rollout_run, tmp_path):
    from harbor.models.trajectories import Trajectory as AtifTrajectory
    from harbor.utils.trajectory_utils import format_trajectory_json
    from harbor.utils.trajectory_validator import TrajectoryValidator

    lines = _lines(rollout_run / "trajectories.jsonl")
    report = export_run(ExportOptions(path=rollout_run, format=ExportFormat.ATIF, model_name="tiny"))
    assert report.out == rollout_run / "trajectories.atif"
    # The rollout whose environment never started has nothing to show: left out, and said why.
    assert report.written == 5 and report.left_out == 1 and "no messages (status env_error)" in report.notes()[0]
    files = sorted(report.out.glob("*.json"))
    assert len(files) == 5
    validator = TrajectoryValidator()
    for file in files:
        assert validator.validate(file), validator.errors
        # Laid out as Harbor lays out its own trajectory.json files.
        assert file.read_text() == format_trajectory_json(AtifTrajectory.model_validate(_atif(file)).to_json_dict())
    by_name = {file.stem: _atif(file) for file in files}

    clean = by_name["local_train_0_ab12-0-0"]
    assert clean["agent"] == {"name": "raygrpo", "version": clean["agent"]["version"], "model_name": "tiny"}
    assert [s["source"] for s in clean["steps"]] == ["user", "agent", "agent"]
    call_step = clean["steps"][1]
    assert call_step["tool_calls"] == [{"tool_call_id": "call_2_1", "function_name": "bash",
                                        "arguments": {"command": "echo fixed"}}]
    result = call_step["observation"]["results"][0]
    assert result["source_call_id"] == "call_2_1" and result["content"] == lines[0]["messages"][2]["content"]
    assert result["extra"] == {"tool": "bash", "reward": None, "finished": False,
                               "metadata": {"exit_code": 0, "cwd": "/app"}}
    assert clean["extra"]["reward"] == 1.0 and clean["extra"]["status"] == "ok"
    assert clean["extra"]["verifier"] == lines[0]["verifier"] and clean["extra"]["timings"] == lines[0]["timings"]
    assert "messages" not in clean["extra"] and "completion_ids" not in clean["extra"]
    # The tokens, split per turn, put back together are the line's.
    agent_steps = [s for s in clean["steps"] if s["source"] == "agent"]
    assert agent_steps[0]["metrics"]["prompt_token_ids"] == lines[0]["prompt_ids"]
    last = agent_steps[-1]["metrics"]
    whole = lines[0]["prompt_ids"] + lines[0]["completion_ids"]
    assert last["prompt_token_ids"] + last["completion_token_ids"] == whole
    assert sum(len(s["metrics"]["logprobs"]) for s in agent_steps) == sum(lines[0]["env_mask"])
    assert [s["extra"]["policy_version"] for s in agent_steps] == lines[0]["policy_versions"]
    assert clean["final_metrics"]["total_completion_tokens"] == sum(lines[0]["env_mask"])

    messy = by_name["local_train_1_ab12-1-0"]
    assert [s["source"] for s in messy["steps"]] == ["system", "user", "agent", "agent", "agent"]
    first, second = messy["steps"][2], messy["steps"][3]
    results = first["observation"]["results"]
    assert [r.get("source_call_id") for r in results] == ["call_3_1", None]  # the malformed call has none
    assert results[1]["extra"]["tool"] == "invalid_tool_call"
    assert [c["function_name"] for c in second["tool_calls"]] == ["python", "bash"]
    # A refused call (unknown tool) ran no environment step: results and steps do not pair one to one, so the
    # environment's steps stay in `extra` only.
    assert all("reward" not in r["extra"] for s in (first, second) for r in s["observation"]["results"])
    assert messy["extra"]["steps"] == lines[1]["steps"]

    cut = by_name["local_train_2_ab12-2-0"]
    assert cut["extra"]["status"] == "truncated" and cut["extra"]["env_ids_after_last_turn"]
    assert cut["extra"]["env_ids_after_last_turn"] == lines[2]["completion_ids"][-len(
        cut["extra"]["env_ids_after_last_turn"]):]

    ors = by_name["qa_train_3_ab12-3-0"]
    answer = ors["steps"][-1]["observation"]["results"]
    assert answer == [{"extra": {"tool": ANSWER_STEP, "reward": 1.0, "finished": True,
                                 "metadata": {"graded": True}}}]
    assert ors["steps"][1]["observation"]["results"][0]["extra"]["reward"] == 0.1

    oracle = by_name["local_train_5_cd34-0-0"]
    acting = oracle["steps"][-1]
    assert acting["llm_call_count"] == 0 and acting["tool_calls"][0]["function_name"] == SOLUTION_STEP
    assert acting["observation"]["results"][0]["content"] == "fixed\n" and "metrics" not in acting


class SteppedShellEnv(ShellEnv):
    """Harbor's multi-step task shape (`SteppedAdapter`): three steps, each opened by a user message of instruction
    and scored on its own; the oracle's solution solves the first two steps only."""

    multi_step = True

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    async def score(self) -> float | None:
        await super().score()
        return 1.0 if self.step < 2 else 0.0

    async def next_step(self) -> Observation | None:
        self.step += 1
        if self.step == 3:
            return None
        return Observation(messages=[{"role": "user", "content": f"Step {self.step + 1}: go on."}], tools=[])

    def episode_reward(self) -> float:
        return 2 / 3


@pytest.mark.timeout(60)
def test_atif_of_a_multi_step_oracle_run_puts_each_solution_after_its_instruction_with_its_reward(tmp_path):
    from harbor.models.trajectories import Trajectory as AtifTrajectory
    from harbor.utils.trajectory_validator import TrajectoryValidator

    traj = asyncio.run(run_rollout(_harbor_task(8), SteppedShellEnv(), OraclePolicy(), None, SamplingParams(),
                                   RolloutConfig(system_prompt="Be brief.")))
    assert traj.step_rewards == [1.0, 1.0, 0.0] and [s["tool"] for s in traj.steps] == [SOLUTION_STEP] * 3
    writer = TrajectoryWriter(tmp_path / "trajectories.jsonl")
    writer.write(traj)
    writer.close()
    report = export_run(ExportOptions(path=tmp_path, format=ExportFormat.ATIF))
    file = next(report.out.glob("*.json"))
    assert TrajectoryValidator().validate(file)
    atif = AtifTrajectory.model_validate(_atif(file)).to_json_dict()
    steps = atif["steps"]
    assert [(s["source"], s.get("message")) for s in steps if s["source"] != "agent"] == [
        ("system", "Be brief."), ("user", "Fix `raygrpo/task-8` — ünïcode."), ("user", "Step 2: go on."),
        ("user", "Step 3: go on.")]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "user", "agent", "user", "agent"]
    runs = [s["observation"]["results"][0]["extra"] for s in steps if s["source"] == "agent"]
    assert [(r["tool"], r["reward"], r["episode_step"]) for r in runs] == [
        (SOLUTION_STEP, 1.0, 1), (SOLUTION_STEP, 1.0, 2), (SOLUTION_STEP, 0.0, 3)]
    assert [s["step_id"] for s in steps] == list(range(1, 8))
    assert atif["extra"]["step_rewards"] == [1.0, 1.0, 0.0] and atif["extra"]["reward"] == pytest.approx(2 / 3)


@pytest.mark.timeout(60)
def test_atif_keeps_the_token_arrays_whole_where_they_do_not_split_per_turn(rollout_run):
    from raygrpo.export.atif import TOKEN_KEYS, to_atif

    line = _lines(rollout_run / "trajectories.jsonl")[0]
    # The prompt alone used the token budget: no turn, but a prompt.
    unturned = line | {"turns": 0, "policy_versions": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                       "messages": line["messages"][:1], "status": "truncated"}
    atif = to_atif(unturned, name="n", agent_version="0").to_json_dict()
    assert [s["source"] for s in atif["steps"]] == ["user"]
    assert {k: atif["extra"][k] for k in TOKEN_KEYS} == {k: unturned[k] for k in TOKEN_KEYS}
    # A turn that generated nothing: the model's spans are not one per turn.
    empty_turn = line | {"turns": 3, "policy_versions": [0, 0, 0]}
    atif = to_atif(empty_turn, name="n", agent_version="0").to_json_dict()
    assert all("metrics" not in s for s in atif["steps"]) and atif["extra"]["prompt_ids"] == line["prompt_ids"]


@pytest.mark.timeout(60)
def test_atif_of_a_training_run_names_each_file_by_its_step(training_run):
    from harbor.utils.trajectory_validator import TrajectoryValidator

    report = export_run(ExportOptions(path=training_run, format=ExportFormat.ATIF))
    names = sorted(f.stem for f in report.out.glob("*.json"))
    assert len(names) == 10 and names[0] == "step1-local_train_0_ab12-0-0" and names[-1].startswith("step2-")
    assert all(TrajectoryValidator().validate(f) for f in report.out.glob("*.json"))
    assert _atif(report.out / f"{names[0]}.json")["extra"]["step"] == 1


@pytest.mark.timeout(60)
def test_a_cut_off_last_line_is_left_out_and_said_in_one_line(rollout_run, tmp_path, cli):
    text = (rollout_run / "trajectories.jsonl").read_text(encoding="utf-8")
    (tmp_path / "trajectories.jsonl").write_text(text + text.splitlines()[0][:123], encoding="utf-8")
    code, out, err = cli(str(tmp_path), "--format", "parquet", "--no-progress")
    assert code == 0, err
    assert err.strip().count("\n") == 0 and "line 7, the last, is cut off" in err and "6 complete line(s)" in err
    assert "wrote 6 trajectory row(s)" in out
    assert list(read_parquet(tmp_path / "trajectories.parquet")) == _lines(rollout_run / "trajectories.jsonl")


@pytest.mark.timeout(60)
def test_a_second_run_with_the_same_out_starts_the_trajectories_anew(rollout_run, tmp_path, caplog):
    """A rollout run's writer replaces a previous run's lines (saying how many), as a fresh training run does, so
    an export never mixes two runs nor loses a line glued onto a killed run's cut-off one."""
    text = (rollout_run / "trajectories.jsonl").read_text(encoding="utf-8")
    path = tmp_path / "trajectories.jsonl"
    path.write_text(text + text.splitlines()[0][:123], encoding="utf-8")  # the killed first run: 6 + 1 cut off
    old_logs = tmp_path / "verifier_logs"
    for rollout in ("g0-0-0", "g0-1-0"):  # and its kept verifier logs
        (old_logs / rollout / "verifier").mkdir(parents=True)
        (old_logs / rollout / "verifier" / "test-stdout.txt").write_text("old run\n")
    trajectory = asyncio.run(run_rollout(_harbor_task(7), ShellEnv(), OraclePolicy(), None, SamplingParams(),
                                         RolloutConfig()))
    with caplog.at_level("WARNING"):
        writer = TrajectoryWriter(path)
        writer.write(trajectory)
        writer.close()
    assert f"{path} holds 7 line(s) of a previous run" in caplog.text
    assert f"{old_logs} holds the verifier logs of 2 rollout(s) of a previous run" in caplog.text
    assert not (old_logs / "g0-0-0").exists() and not (old_logs / "g0-1-0").exists()  # this run's own may be there
    assert [line["task"]["index"] for line in _lines(path)] == [7]
    assert export_run(ExportOptions(path=tmp_path, format=ExportFormat.PARQUET)).written == 1

    # Appending (no command does today) keeps the lines, dropping a cut-off last one first.
    path.write_text(text + text.splitlines()[0][:123], encoding="utf-8")
    writer = TrajectoryWriter(path, append=True)
    writer.write(trajectory)
    writer.close()
    assert [line["task"]["index"] for line in _lines(path)] == [0, 1, 2, 3, 4, 5, 7]


@pytest.mark.timeout(60)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(rollout_run, tmp_path, cli):
    empty_run = tmp_path / "empty-run"
    empty_run.mkdir()
    (empty_run / "summary.json").write_text("{}")
    code, _, err = cli(str(empty_run), "--format", "parquet")
    assert code == 2 and "has no trajectories: neither trajectories.jsonl" in err and err.count("\n") == 1

    code, _, err = cli(str(tmp_path / "missing"), "--format", "hf")
    assert code == 2 and "no such run folder or file" in err

    (empty_run / "trajectories.jsonl").write_text('{"schema_version": 5, "task": ')  # killed on its first line
    code, _, err = cli(str(empty_run), "--format", "atif")
    assert code == 2 and "no complete trajectory to export (its only line is cut off)" in err

    text = (rollout_run / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    (empty_run / "trajectories.jsonl").write_text("\n".join([text[0], text[1][:50], text[2]]) + "\n")
    code, _, err = cli(str(empty_run), "--format", "parquet")
    assert code == 2 and "line 2 is not valid JSON" in err

    newer = json.loads(text[0]) | {"schema_version": TRAJECTORY_SCHEMA_VERSION + 1}
    (empty_run / "trajectories.jsonl").write_text(json.dumps(newer) + "\n")
    code, _, err = cli(str(empty_run), "--format", "parquet")
    assert code == 2 and f"schema_version {TRAJECTORY_SCHEMA_VERSION + 1}, newer than this raygrpo" in err

    huge = json.loads(text[0])
    huge["prompt_ids"][0] = 2**40  # not a token id: does not fit its int32 column
    (empty_run / "trajectories.jsonl").write_text(json.dumps(huge) + "\n")
    code, _, err = cli(str(empty_run), "--format", "parquet")
    assert code == 2 and "lines 1-1: a value does not fit its column" in err
    assert sorted(p.name for p in empty_run.iterdir()) == ["summary.json", "trajectories.jsonl"]  # nothing left

    code, _, _ = cli(str(rollout_run), "--format", "parquet", "--out", str(tmp_path / "x.parquet"))
    assert code == 0
    code, _, err = cli(str(rollout_run), "--format", "parquet", "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "exists: pass --overwrite" in err
    code, out, _ = cli(str(rollout_run), "--format", "parquet", "--out", str(tmp_path / "x.parquet"), "--overwrite")
    assert code == 0 and "wrote 6 trajectory row(s)" in out


@pytest.mark.timeout(60)
def test_a_token_id_or_mask_that_is_not_an_integer_fails_the_export_naming_line_and_field(rollout_run, tmp_path,
                                                                                           cli):
    """pyarrow truncates a float into an integer column (2.5 to 2, 1.9 to 1) without a word: such a line fails the
    export instead, naming its line and field; an integral float (2.0) is stored as the integer it equals."""
    line = _lines(rollout_run / "trajectories.jsonl")[0]
    run = tmp_path / "run"
    run.mkdir()
    source = run / "trajectories.jsonl"
    cases = [("prompt_ids", [line["prompt_ids"][0], 2.5]), ("env_mask", [1.9] + line["env_mask"][1:]),
             ("completion_ids", [True] + line["completion_ids"][1:])]
    for field, value in cases:
        source.write_text(json.dumps(line) + "\n" + json.dumps(line | {field: value}) + "\n")
        for fmt in ("parquet", "hf"):
            code, _, err = cli(str(run), "--format", fmt)
            assert code == 2 and f"trajectories.jsonl: line 2: {field}: item" in err and "not an integer" in err
    source.write_text(json.dumps(line | {"prompt_ids": [line["prompt_ids"][0], 2.5]}) + "\n")
    code, _, err = cli(str(run), "--format", "atif")
    assert code == 2 and "line 1: Harbor's ATIF model refuses" in err and "fractional part" in err
    assert sorted(p.name for p in run.iterdir()) == ["trajectories.jsonl"]  # nothing left

    integral = line | {"prompt_ids": [float(t) for t in line["prompt_ids"]]}
    source.write_text(json.dumps(integral) + "\n")
    code, _, err = cli(str(run), "--format", "parquet")
    assert code == 0, err
    back = next(read_parquet(run / "trajectories.parquet"))
    assert back == integral and type(back["prompt_ids"][0]) is int


@pytest.mark.timeout(60)
def test_an_export_removes_the_staging_folder_a_killed_export_left_but_no_live_ones(rollout_run, tmp_path):
    """An export killed with SIGKILL runs no clean-up: the next export of the same output removes its hidden staging
    folder, and leaves those of exports still running (another process, another host) and of other outputs."""
    import socket
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectories.jsonl").write_text((rollout_run / "trajectories.jsonl").read_text(encoding="utf-8"),
                                            encoding="utf-8")
    # An export that stops once its staging folder is made, until it is killed.
    code = "\n".join([
        "import sys, time", "import raygrpo.export.run as run",
        "def stuck(lines, folder, *args):", "    folder.mkdir(); print('staged', flush=True); time.sleep(120)",
        "run._write_atif = stuck",
        "run.export_run(run.ExportOptions(path=sys.argv[1], format='atif'))"])

    def staging() -> set[str]:
        return {p.name for p in run.iterdir() if p.name.startswith(".")}

    live = None
    killed = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline().strip() == "staged"
        killed_names = staging()
        live = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
        assert live.stdout.readline().strip() == "staged"
        live_names = staging() - killed_names
        assert len(killed_names) == len(live_names) == 1
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        other_host = f".trajectories.atif.export-elsewhere-{killed.pid}-abcd1234"
        other_output = f".trajectories.parquet.export-{socket.gethostname()}-{killed.pid}-abcd1234"
        for name in (other_host, other_output):
            (run / name).mkdir()
        report = export_run(ExportOptions(path=run, format=ExportFormat.ATIF))
        assert report.written == 5
        assert staging() == live_names | {other_host, other_output}
    finally:
        for proc in (killed, live):
            if proc is not None:
                proc.kill()
                proc.wait(10)


@pytest.mark.timeout(60)
def test_the_cli_exports_each_format_and_a_library_error_is_an_export_error(rollout_run, tmp_path, cli):
    for fmt, unit in (("atif", "file(s)"), ("hf", "row(s)"), ("parquet", "row(s)")):
        out = tmp_path / f"out-{fmt}"
        code, stdout, err = cli(str(rollout_run / "trajectories.jsonl"), "--format", fmt, "--out", str(out))
        assert code == 0, err
        assert f"trajectory {unit}" in stdout and out.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left
    for out in (rollout_run / "trajectories.jsonl", rollout_run):  # replacing either would remove the input
        with pytest.raises(ExportError, match="is or holds trajectories.jsonl, the file being exported"):
            export_run(ExportOptions(path=rollout_run, format=ExportFormat.ATIF, out=out, overwrite=True))
    assert (rollout_run / "trajectories.jsonl").is_file()
