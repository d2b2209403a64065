"""Core records shared by every layer: tasks, observations, tool results, turns and trajectories.

These are plain dataclasses (internal records, not user config): cheap to build, picklable for Ray, and turned into
JSON with `to_dict()` when a trajectory is written out.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """How a rollout ended (DESIGN section 7).

    The model's doing, always scored unless the config masks it: `OK` (the episode ended with a reward), `NO_ANSWER`
    (the model stopped, or the environment ended the episode, without a reward: `rollout.unanswered_reward`),
    `TRUNCATED` (a turn, token or whole-rollout limit reached: `rollout.truncated_reward`).
    Never scored: `TIMEOUT` (scoring ran past its deadline, e.g. a hung verifier), `TASK_ERROR` (the task itself is
    broken: its verifier wrote no reward, its image does not build; not retried, reported), `ENV_ERROR`,
    `VERIFIER_ERROR` (the verifier's tooling was shown broken by evidence gathered before the model acted) and
    `POLICY_ERROR` (infrastructure failures: the orchestrator retries them; their reward is None, never 0.0) and
    `CANCELLED` (stopped by the user).
    """

    OK = "ok"
    NO_ANSWER = "no_answer"
    TRUNCATED = "truncated"
    TIMEOUT = "timeout"
    TASK_ERROR = "task_error"
    ENV_ERROR = "env_error"
    VERIFIER_ERROR = "verifier_error"
    POLICY_ERROR = "policy_error"
    CANCELLED = "cancelled"

    @property
    def is_infra_failure(self) -> bool:
        """The environment or the policy failed: the orchestrator retries it."""
        return self in (Status.ENV_ERROR, Status.VERIFIER_ERROR, Status.POLICY_ERROR)

    @property
    def is_models_doing(self) -> bool:
        """The model caused this ending (`OK`, `NO_ANSWER`, `TRUNCATED`): unscored, it still says how the model did."""
        return self in (Status.OK, Status.NO_ANSWER, Status.TRUNCATED)

    @property
    def is_failure(self) -> bool:
        """Unscored because something other than the model failed (after any retries), or a deadline passed: what
        a run's exit code counts (`raygrpo.core.outcome`)."""
        return self.is_infra_failure or self is Status.TIMEOUT


@dataclass(frozen=True)
class TaskRef:
    """Serializable pointer to one task of one environment.

    Args:
        env: Name of the environment in the run config (several may be mixed in one run).
        index: Task index within `split`.
        split: Split the task comes from.
        prompt: Optional prompt text known ahead of time (ORS prompts come from the session instead).
        metadata: Task metadata columns (the ORS task spec); a scripted policy may read them.
    """

    env: str
    index: int
    split: str = "train"
    prompt: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class Observation:
    """What an environment shows the model when its episode starts.

    Args:
        messages: Chat messages (`{"role", "content"}`) that open the conversation.
        tools: Tool schemas in OpenAI function format (`{"type": "function", "function": {...}}`).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


@dataclass
class ToolResult:
    """The environment's answer to one tool call.

    Args:
        text: Text shown to the model.
        reward: Reward the call produced, if any.
        finished: True when the episode is over.
        error: True when the call was refused (unknown tool, bad arguments, environment said no); the session lives.
        metadata: What the environment reported beside the result (an ORS tool's `metadata`), kept in the
            trajectory's steps.
    """

    text: str
    reward: float | None = None
    finished: bool = False
    error: bool = False
    metadata: dict[str, Any] | None = None


@dataclass
class SamplingParams:
    """Sampling settings for one generation.

    Args:
        max_tokens: Most tokens to generate in this turn.
        temperature: Sampling temperature; 0 means greedy.
        top_p: Nucleus sampling mass.
        seed: Optional seed for reproducible sampling.
        min_version: Generate with weights of at least this policy version. Engines that track versions (the
            transformers engine) hold the request until they have them; in async training this lets a rollout start
            its environment early (a sandbox boots) while its first turn waits for the learner's next weights.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    min_version: int = 0


#: The policy version of turns written by a policy without trainable weights (a script), or whose weights raygrpo does
#: not track (a vLLM server that TRL syncs). Staleness then falls back to the learner's version when the rollout was
#: dispatched.
UNVERSIONED = -1


@dataclass
class Turn:
    """One generation by the policy.

    Args:
        output_ids: Generated token ids, including the end-of-turn token when the model stopped by itself.
        logprobs: One log-probability per output id.
        finish_reason: `"stop"` (end-of-turn token) or `"length"` (token budget hit).
        policy_version: Version of the weights that produced this turn (`UNVERSIONED` if unknown).
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"
    policy_version: int = 0


@dataclass
class ToolCall:
    """A tool call parsed from the model's text."""

    name: str
    arguments: dict[str, Any]


#: Version of a trajectory line's fields; bumped with every change to them (docs/outputs.md lists the fields).
TRAJECTORY_SCHEMA_VERSION = 6
#: `steps[].tool` of a final answer that an ORS environment's `@terminal` tool scored.
ANSWER_STEP = "(answer)"
#: `steps[].tool` of a task's reference solution run by the oracle policy (its metadata: `exit_code`, `output_tail`).
SOLUTION_STEP = "(solution)"


@dataclass
class Trajectory:
    """One finished rollout: tokens for the learner, messages for people, and how it went.

    Args:
        task: The task this rollout ran.
        prompt_ids: The templated prompt (messages + tools, generation prompt included).
        completion_ids: Every token after the prompt: model turns and tool-result tokens.
        logprobs: One per completion id; 0.0 for environment tokens.
        env_mask: One per completion id; 1 = model token (trained on), 0 = environment token.
        messages: The decoded conversation, tool calls and results included, for people to read.
        reward: Outcome reward, or None when nothing was scored or the rollout failed.
        status: How it ended.
        error: Short description of a failure, if any.
        turns: Number of model generations.
        tool_calls: Number of tool calls executed.
        timings: Seconds spent per phase: `provision`, `generate`, `tools`, `verify`, `total`; and within
            `provision`, where the environment times them: `governor_wait` (for the provider's governor), `backoff`
            (after its refusals), `warm_wait` (for a warm sandbox), `start` (the sandbox's own start).
        policy_versions: The policy version of each turn.
        attempt: 0 for a first try; n for the n-th retry after an infrastructure failure.
        group_id: The group (G rollouts of one task) this trajectory belongs to.
        sample: Index of this rollout within its group (0..G-1).
        worker: Name of the env pool actor that ran it.
        node: IP address of the Ray node it ran on.
        env_span: Wall-clock times (`time.time()`) when its environment was opened and closed; the run summary
            derives the peak of environments alive at once from these.
        steps: One record per environment step, in order: `{tool, reward, finished, metadata}` for each tool call
            the environment ran, and for a final answer routed to an ORS `@terminal` tool (`tool` is
            `ANSWER_STEP`).
        verifier: What the environment's verifier left behind, for environments that run one (Harbor):
            `{exit_code, output_tail, rewards}` (the raw rewards before reduction) and, where the spec keeps them,
            `logs` (the sandbox's `/logs` files; a run folder holds them under `verifier_logs/` and the line names
            the folder as `logs_dir`). None where nothing was verified.
        sandbox: How its environment was provided, where the environment says: `"cold"` (started for it),
            `"hedged"` (started for it, by the second of two starts), `"warm"` (from the warm pool). None otherwise.
        step_rewards: For an episode of several steps (a Harbor multi-step task), each scored step's reward in
            order (`reward` is the episode's, by the task's aggregation); a step a `min_reward` ended the episode
            after is the last. Empty for an episode without steps.
    """

    task: TaskRef
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    status: Status = Status.OK
    error: str | None = None
    turns: int = 0
    tool_calls: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    policy_versions: list[int] = field(default_factory=list)
    attempt: int = 0
    group_id: str = ""
    sample: int = 0
    worker: str = ""
    node: str = ""
    env_span: tuple[float, float] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    verifier: dict[str, Any] | None = None
    sandbox: str | None = None
    step_rewards: list[float | None] = field(default_factory=list)

    @property
    def scored(self) -> bool:
        return self.reward is not None

    def to_dict(self) -> dict[str, Any]:
        """The trajectory as one JSON line (`trajectories.jsonl`, `rollouts.jsonl`), with its `schema_version`."""
        out = {"schema_version": TRAJECTORY_SCHEMA_VERSION, **dataclasses.asdict(self)}
        out["status"] = self.status.value
        return out


@dataclass(frozen=True)
class RolloutCall:
    """One rollout as the orchestrator sends it to an env pool actor (`EnvPool.run_many`, several in one call).

    Args:
        task: The task to roll out.
        group_id: The group it belongs to.
        attempt: 0 for a first try, n for the n-th retry.
        sample: Its index in the group.
        min_version: The lowest policy version it may generate with (`SamplingParams.min_version`).
        policy: A built-in acting policy to run it with instead of the run's (`"oracle"`, `"noop"`); None: the run's.
        seed_key: What its per-request sampling seeds derive from, stable from run to run (`RolloutRequest.seed_key`);
            empty: the group id.
    """

    task: TaskRef
    group_id: str = ""
    attempt: int = 0
    sample: int = 0
    min_version: int = 0
    policy: str | None = None
    seed_key: str = ""
