"""Settings of each rollout: the group size and the limits of the agent loop."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raygrpo.specs.moved_fields import refuse_moved_fields

#: Rollout settings that moved to the environment specs, which own those deadlines now.
MOVED_FIELDS: dict[str, str] = {
    "start_timeout_s": "moved to envs.<name>.start_timeout_s (counted from when the start gets its slot, not while "
                       "it queues)",
    "tool_timeout_s": "moved to envs.<name>.tool_timeout_s (ORS) or envs.<name>.exec_timeout_s (Harbor)",
    "score_timeout_s": "moved to envs.<name>.verifier_timeout_s (Harbor; unset uses the task's own timeout)",
}


#: `apply_chat_template` arguments the agent loop sets itself for each rendering: not `chat_template_kwargs`.
RENDERING_ARGUMENTS = ("conversation", "tools", "documents", "chat_template", "add_generation_prompt", "tokenize",
                       "return_dict", "messages")


class RolloutConfig(BaseModel):
    """Limits and shape of one rollout.

    The agent loop owns the limits of the model's side of an episode (turns, tokens, its whole duration); the
    environment owns the deadlines of its own operations (start, tool calls, scoring, close) on its spec, each counted
    from a documented start, so no deadline has two owners.

    Args:
        group_size: Rollouts per task (GRPO's G); they form one group.
        max_turns: Most model generations per rollout.
        max_total_tokens: Most tokens per rollout, prompt and tool results included.
        max_tool_calls_per_turn: Most tool calls run from one model turn; extra calls get an error message.
        max_tool_output_chars: Tool results longer than this are cut, with a note saying so.
        max_tool_input_chars: A tool call whose arguments (as JSON) are longer than this is not sent to the
            environment; the model is told instead.
        rollout_timeout_s: Deadline of the episode once its environment is up: the model's turns, the tool calls
            and scoring. The environment's start (and the wait for a start slot) is not counted. Past it the rollout
            ends `truncated`, like one that ran out of turns, unless one call still in flight had taken half of it
            (`env_error`, `policy_error`) or the scorer was running (`timeout`): docs/statuses.md, whose deadline.
        unanswered_reward: Reward of a rollout that ended without one, by the model's doing (status `no_answer`):
            the model stopped without calling the scoring tool, or the environment ended the episode without a
            reward. 0.0 (the default) counts it as a failed attempt; None leaves it unscored (advantage 0 in GRPO:
            neither rewarded nor punished).
        truncated_reward: Reward of a rollout that reached a turn, token or time limit (status `truncated`),
            whatever rewards its steps gave on the way. 0.0 by default; None leaves it unscored, as DAPO's overlong
            filtering does.
        system_prompt: Optional system message put before the environment's prompt.
        chat_template_kwargs: Extra keyword arguments of the tokenizer's chat template, passed to every rendering
            the agent loop makes (a rollout's prompt, each block of tool results or user turns that follows a model
            turn) and to the warm-up's prompts, which are laid out the same way: e.g. `{enable_thinking: false}` for
            Qwen3, whose template then opens the generation prompt with an empty think block, so the model answers
            without thinking. raygrpo renders every prompt itself, so TRL's `trainer.chat_template_kwargs` would
            reach no template and is refused pointing here. The arguments the loop sets per rendering (`tools`,
            `add_generation_prompt`, `chat_template`, ...) are refused.
    """

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(4, ge=1)
    max_turns: int = Field(8, ge=1)
    max_total_tokens: int = Field(4096, ge=16)
    max_tool_calls_per_turn: int = Field(8, ge=1)
    max_tool_output_chars: int = Field(4000, ge=64)
    max_tool_input_chars: int = Field(16000, ge=64)
    rollout_timeout_s: float = Field(900.0, gt=0)
    unanswered_reward: float | None = 0.0
    truncated_reward: float | None = 0.0
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(kwargs) & set(RENDERING_ARGUMENTS))
        if taken:
            raise ValueError(f"{taken} are set by the agent loop for each rendering, not by chat_template_kwargs")
        return kwargs

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_fields(cls, data: Any) -> Any:
        return refuse_moved_fields(data, MOVED_FIELDS)
