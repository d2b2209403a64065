"""A trajectory line as Harbor's ATIF (Agent Trajectory Interchange Format), built and validated with Harbor's own
models (`harbor.models.trajectories`, ATIF-v1.8 in harbor 0.25).

What maps where:

- The conversation (`messages`) becomes the steps, in order: a `system` message a system step, a `user` message a
  user step, each assistant message an agent step with its tool calls, and the tool messages after it that step's
  `observation`, one result per message, each pointing at its call (`source_call_id`). raygrpo's messages are in the
  chat template's format and carry no call ids, so calls get `call_<step>_<n>`; a result of a call the agent loop
  could not parse (tool `invalid_tool_call`) points at none and says so in its `extra`. An assistant message that
  the environment's opening held (not generated in this rollout) is marked `is_copied_context`.
- Tokens, per generated agent step, in `metrics`: `prompt_token_ids` (everything the model was given for that turn:
  the prompt, earlier turns and tool results), `completion_token_ids` and `logprobs` (its turn), and their counts;
  `extra.policy_version` is the weights' version that wrote it. The turns are the spans of `env_mask` == 1, one per
  turn in raygrpo's loop; where a line does not split that way (a turn that generated nothing) its four token arrays
  stay whole in the trajectory's `extra` instead.
- The environment's steps (`steps`: reward, finished, metadata of each call it ran) go on the observation results
  of their calls when they pair one to one (every call ran, none was refused); a final answer scored by an ORS
  `@terminal` tool is a result without a call on the last agent step; a built-in acting policy's run (the oracle's
  `solve.sh`) is an agent step with `llm_call_count` 0 (no model), its pseudo-call and the output's tail; in an
  episode of several steps (a Harbor multi-step task, one user message of instruction per step) the k-th run
  follows the k-th instruction and its result carries the k-th step's reward (`step_rewards`) and `episode_step`.
- The reward, status, error, per-phase timings, verifier evidence, task and every other field of the line are the
  trajectory's `extra` (all but `messages`, and the token arrays where they were split per step): ATIF has no reward
  field (Harbor keeps rewards in a trial's result, not its trajectory).
- `agent` is `raygrpo` at the installed version, with `model_name` as the caller gives it: a run folder does not
  record its model. `session_id` and `trajectory_id` name the rollout (`<group>-<sample>-<attempt>`, with
  `step<N>-` before it for a training run), as its `verifier_logs/` folder does.

Not mapped: step timestamps (raygrpo records how long each phase took and when the environment opened and closed,
`extra.timings` and `extra.env_span`, not when each turn happened); the tool definitions (a line does not keep the
tools its environment offered); the text a `@terminal` tool replied to a final answer (raygrpo keeps its reward and
metadata, not its text, so that result has no `content`); environment tokens after the last turn, which no
generation saw (kept in `extra.env_ids_after_last_turn`).

ORS episodes map the same way and are exported: their calls, results and per-call rewards have the same shape as
Harbor's, with the one gap above for `@terminal` answers. Left out, each with its reason: a trajectory without
messages (a rollout that failed before its episode began: ATIF needs at least one step), and one with a message
ATIF has no place for (a role other than system, user, assistant and tool, a tool message before any assistant
message, content that is neither text nor a list of text parts, a malformed tool call entry).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from harbor.models.trajectories import Trajectory as AtifTrajectory

from raygrpo.core.types import ANSWER_STEP

#: The tool name raygrpo's agent loop gives the result of a call it could not parse (`raygrpo.agent.rollout`).
INVALID_TOOL_CALL = "invalid_tool_call"
#: Line fields that hold tokens; split per agent step when the turns split cleanly.
TOKEN_KEYS = ("prompt_ids", "completion_ids", "logprobs", "env_mask")
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls"}


class NotMappable(ValueError):
    """The trajectory has something ATIF has no place for; the message says what."""


def rollout_id(record: dict[str, Any]) -> str:
    """The rollout's name: `<group>-<sample>-<attempt>` (as its `verifier_logs/` folder), `step<N>-` first in a
    training run; safe as a file name."""
    name = f"{record.get('group_id') or 'rollout'}-{record.get('sample', 0)}-{record.get('attempt', 0)}"
    if record.get("step") is not None:
        name = f"step{record['step']}-{name}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def to_atif(record: dict[str, Any], *, name: str, agent_version: str, model_name: str | None = None,
            origin: str | None = None) -> AtifTrajectory:
    """The ATIF trajectory of one trajectory line (see the module docstring for the mapping).

    Args:
        record: The parsed JSON line.
        name: Its `session_id` and `trajectory_id` (`rollout_id`).
        agent_version: The `agent.version` (the installed raygrpo's).
        model_name: The `agent.model_name`, when the caller knows it.
        origin: Where the line came from (`file:line`), for the notes.

    Raises:
        NotMappable: The line has something ATIF has no place for.
        pydantic.ValidationError: Harbor's models reject what was built (a bug here, not in the input).
    """
    messages = record.get("messages") or []
    if not messages:
        raise NotMappable(f"no messages (status {record.get('status')}): the rollout ended before its episode began")
    turns = record.get("turns") or 0
    assistants = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
    # Each turn appends one assistant message, after the opening: the last `turns` of them were generated. A line
    # with fewer (a turn that failed before its message was kept) has them all generated, but not aligned to turns.
    generated = assistants[max(0, len(assistants) - turns):]
    aligned = len(generated) == turns
    spans = _turn_spans(record) if aligned and turns else None  # None: the token arrays stay whole in `extra`
    versions = (record.get("policy_versions") or []) if aligned else []

    env_steps = [s for s in record.get("steps") or [] if isinstance(s, dict)]
    # A built-in acting policy's runs (the oracle's), one per step of the episode: with no model turn, each follows
    # its step's instruction (a user message) and carries that step's reward, when the episode has steps.
    acting = [s for s in env_steps if _pseudo(s.get("tool")) and s.get("tool") != ANSWER_STEP]
    interleave = bool(acting) and not assistants
    step_rewards = record.get("step_rewards") if isinstance(record.get("step_rewards"), list) else []
    placed = users = 0

    steps: list[dict[str, Any]] = []
    results: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (observation result, its tool message)
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise NotMappable(f"message {index} is not an object")
        role = message.get("role")
        rest = {k: v for k, v in message.items() if k not in _MESSAGE_KEYS}
        if role == "user":
            if interleave and users and placed < len(acting):  # the next step's instruction: the last one's run first
                steps.append(_acting_step(acting[placed], len(steps) + 1, placed, step_rewards))
                placed += 1
            users += 1
        if role in ("system", "user"):
            step = {"step_id": len(steps) + 1, "source": role, "message": _content(message, index)}
            if message.get("tool_calls"):
                raise NotMappable(f"message {index} ({role}) has tool calls")
            if rest:
                step["extra"] = {"message_fields": rest}
            steps.append(step)
        elif role == "assistant":
            steps.append(_agent_step(record, message, index, len(steps) + 1, generated, spans, versions, rest))
        elif role == "tool":
            if not steps or steps[-1]["source"] != "agent":
                raise NotMappable(f"message {index} is a tool result that follows no assistant message")
            results.append((_result(steps[-1], message, index, rest), message))
        else:
            raise NotMappable(f"message {index} has role {role!r}, which ATIF has no step source for")

    _pair_env_steps(results, [s for s in env_steps if not _pseudo(s.get("tool"))])
    for env_step in env_steps:
        if env_step.get("tool") == ANSWER_STEP:
            _answer_result(steps, env_step)
    for position in range(placed, len(acting)):
        steps.append(_acting_step(acting[position], len(steps) + 1, position if interleave else None,
                                  step_rewards))

    split = spans is not None
    extra = {k: v for k, v in record.items() if k != "messages" and not (split and k in TOKEN_KEYS)}
    if spans:
        tail = record["completion_ids"][spans[-1][1]:]
        if tail:
            extra["env_ids_after_last_turn"] = tail
    metrics = [s["metrics"] for s in steps if "metrics" in s]
    final = {"total_steps": len(steps)}
    if split:
        final["total_prompt_tokens"] = sum(m["prompt_tokens"] for m in metrics)
        final["total_completion_tokens"] = sum(m["completion_tokens"] for m in metrics)
    notes = ("Exported by raygrpo" + (f" from {origin}" if origin else "") + ". The reward, status, per-phase "
             "timings, verifier evidence and the rest of the trajectory line are in `extra` (ATIF has no field for "
             "them); steps carry no timestamps (raygrpo does not record when each turn happened).")
    agent: dict[str, Any] = {"name": "raygrpo", "version": agent_version}
    if model_name:
        agent["model_name"] = model_name
    return AtifTrajectory.model_validate({
        "session_id": name,
        "trajectory_id": name,
        "agent": agent,
        "steps": steps,
        "notes": notes,
        "final_metrics": final,
        "extra": extra,
    })


def to_json(trajectory: AtifTrajectory) -> str:
    """The file text of an ATIF trajectory, laid out as Harbor writes `trajectory.json` (indented, arrays of numbers
    such as token ids on one line, ASCII-escaped).

    Harbor's `format_trajectory_json` indents every number of the token arrays onto a line of its own and then joins
    them with a regular expression, about 60% of an ATIF export's time; this lays the arrays out on one line before
    indenting the rest, to the same bytes (3x faster).
    """
    arrays: list[str] = []
    clash = False

    def compact(value: Any) -> Any:
        nonlocal clash
        if isinstance(value, dict):
            return {k: compact(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and all(type(v) in (int, float) for v in value):
                arrays.append(json.dumps(value))
                return f"\x00{len(arrays) - 1}\x00"
            return [compact(v) for v in value]
        if isinstance(value, str) and "\x00" in value:
            clash = True  # a string that could pass for a placeholder: lay it out the slow way
        return value

    data = trajectory.to_json_dict()
    text = json.dumps(compact(data), indent=2)
    if clash:
        from harbor.utils.trajectory_utils import format_trajectory_json

        return format_trajectory_json(data)
    return _PLACEHOLDER.sub(lambda m: arrays[int(m.group(1))], text)


_PLACEHOLDER = re.compile(r'"\\u0000(\d+)\\u0000"')


def _pseudo(tool: Any) -> bool:
    """A step raygrpo records that is not a tool call of the model: `(answer)`, `(solution)`, `(noop)`."""
    return isinstance(tool, str) and tool.startswith("(") and tool.endswith(")")


def _turn_spans(record: dict[str, Any]) -> list[tuple[int, int]] | None:
    """The [start, end) of each turn's tokens in `completion_ids`: the spans of model tokens (`env_mask` == 1), or
    None when they are not one per turn."""
    mask = record.get("env_mask")
    ids, logprobs = record.get("completion_ids"), record.get("logprobs")
    turns, versions = record.get("turns") or 0, record.get("policy_versions") or []
    if not (isinstance(mask, list) and isinstance(ids, list) and isinstance(logprobs, list)
            and isinstance(record.get("prompt_ids"), list)):
        return None
    if not len(mask) == len(ids) == len(logprobs) or len(versions) != turns:
        return None
    spans: list[tuple[int, int]] = []
    position = 0
    for value, run in itertools.groupby(mask):
        length = sum(1 for _ in run)
        if value == 1:
            spans.append((position, position + length))
        elif value != 0:
            return None
        position += length
    return spans if len(spans) == turns else None


def _content(message: dict[str, Any], index: int) -> str | list[dict[str, Any]]:
    """A message's content as an ATIF message: text, or a list of text parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return [{"type": "text", "text": p["text"]} for p in content]
    raise NotMappable(f"message {index} has content that is neither text nor a list of text parts")


def _agent_step(record: dict[str, Any], message: dict[str, Any], index: int, step_id: int, generated: list[int],
                spans: list[tuple[int, int]] | None, versions: list[Any], rest: dict[str, Any]) -> dict[str, Any]:
    step: dict[str, Any] = {"step_id": step_id, "source": "agent", "message": _content(message, index)}
    calls = message.get("tool_calls")
    if calls:
        step["tool_calls"] = [_tool_call(call, f"call_{step_id}_{n}", index) for n, call in enumerate(calls, 1)]
    extra: dict[str, Any] = {"message_fields": rest} if rest else {}
    if index in generated:
        turn = generated.index(index)
        step["llm_call_count"] = 1
        if turn < len(versions):
            extra["policy_version"] = versions[turn]
        if spans is not None:
            start, end = spans[turn]
            context = record["prompt_ids"] + record["completion_ids"][:start]
            step["metrics"] = {
                "prompt_tokens": len(context),
                "completion_tokens": end - start,
                "prompt_token_ids": context,
                "completion_token_ids": record["completion_ids"][start:end],
                "logprobs": record["logprobs"][start:end],
            }
    else:
        step["is_copied_context"] = True  # the environment's opening held it: not generated in this rollout
    if extra:
        step["extra"] = extra
    return step


def _tool_call(call: Any, call_id: str, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise NotMappable(f"message {index} has a tool call without a function name")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        raise NotMappable(f"message {index} has a tool call whose arguments are not an object")
    out: dict[str, Any] = {"tool_call_id": call_id, "function_name": function["name"], "arguments": arguments}
    rest = {k: v for k, v in call.items() if k not in ("type", "function")}
    if call.get("type") not in (None, "function"):
        rest["type"] = call["type"]
    if rest:
        out["extra"] = rest
    return out


def _result(step: dict[str, Any], message: dict[str, Any], index: int, rest: dict[str, Any]) -> dict[str, Any]:
    """Add the tool message's observation result to the agent step before it, pointing at its call: the next call
    not yet answered, except for a call the loop could not parse (it has no call)."""
    observation = step.setdefault("observation", {"results": []})
    answered = sum(1 for r in observation["results"] if r.get("source_call_id") is not None)
    calls = step.get("tool_calls") or []
    name = message.get("name")
    result: dict[str, Any] = {"content": _content(message, index) if message.get("content") is not None else None}
    extra: dict[str, Any] = {"tool": name}
    if answered < len(calls) and not (name == INVALID_TOOL_CALL and calls[answered]["function_name"] != name):
        result["source_call_id"] = calls[answered]["tool_call_id"]
    elif name == INVALID_TOOL_CALL:
        extra["note"] = "the model's call could not be parsed: no call to point at"
    if rest:
        extra["message_fields"] = rest
    result["extra"] = extra
    observation["results"].append(result)
    return result


def _pair_env_steps(results: list[tuple[dict[str, Any], dict[str, Any]]], calls: list[dict[str, Any]]) -> None:
    """Put each environment step's reward, finished flag and metadata on the result of its call, when the calls the
    environment ran are exactly the results that point at a call (none refused), in order and by name."""
    answered = [(r, m) for r, m in results if r.get("source_call_id") is not None]
    if len(answered) != len(calls) or any(m.get("name") != s.get("tool") for (_, m), s in zip(answered, calls)):
        return
    for (result, _), env_step in zip(answered, calls):
        result["extra"].update(_env_fields(env_step))


def _env_fields(env_step: dict[str, Any]) -> dict[str, Any]:
    return {k: env_step.get(k) for k in ("reward", "finished", "metadata")} | {
        k: v for k, v in env_step.items() if k not in ("tool", "reward", "finished", "metadata")}


def _answer_result(steps: list[dict[str, Any]], env_step: dict[str, Any]) -> None:
    """A final answer an ORS `@terminal` tool scored: a result without a call on the last agent step (its reply text
    was not recorded)."""
    agent = next((s for s in reversed(steps) if s["source"] == "agent"), None)
    if agent is None:
        raise NotMappable("an (answer) step with no agent step to attach it to")
    agent.setdefault("observation", {"results": []})["results"].append(
        {"content": None, "extra": {"tool": ANSWER_STEP, **_env_fields(env_step)}})


def _acting_step(env_step: dict[str, Any], step_id: int, position: int | None,
                 step_rewards: list[Any]) -> dict[str, Any]:
    """A built-in acting policy's run (the oracle's `solve.sh`): an agent step without a model call.

    `position` is which step of the episode it ran in (None when that is not known): its result's `reward` is that
    step's (`step_rewards`), where the run itself recorded none (a script's run has no reward of its own)."""
    call_id = f"call_{step_id}_1"
    metadata = env_step.get("metadata") if isinstance(env_step.get("metadata"), dict) else {}
    tail = metadata.get("output_tail")
    fields = _env_fields(env_step)
    if fields.get("reward") is None and position is not None and position < len(step_rewards):
        fields["reward"] = step_rewards[position]
        fields["episode_step"] = position + 1
    return {
        "step_id": step_id,
        "source": "agent",
        "message": "",
        "llm_call_count": 0,
        "tool_calls": [{"tool_call_id": call_id, "function_name": env_step["tool"], "arguments": {}}],
        "observation": {"results": [{"source_call_id": call_id, "content": tail if isinstance(tail, str) else None,
                                     "extra": {"tool": env_step["tool"], **fields}}]},
    }
