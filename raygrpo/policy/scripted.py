"""A policy that says what a script tells it to: for tests, benchmarks and environment debugging.

The script is an ordinary function of the `GenerationContext` (task, conversation so far, turn index) returning the
assistant's text. The text is encoded with the run's tokenizer and goes back through exactly the path a model's
output takes (decode, tool-call parsing, chat template), so a scripted run exercises the agent loop and the
environments end to end without a model. Log-probabilities are 0.0: a scripted turn is certain.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from raygrpo.policy.base import GenerationContext, PolicyError, SamplingParams
from raygrpo.core.types import UNVERSIONED, TaskRef, Turn

logger = logging.getLogger(__name__)

#: What a script returns: the assistant's text, or None for "say nothing more" (an empty turn). May be async.
Script = Callable[[GenerationContext], "str | None | Awaitable[str | None]"]


class ScriptedPolicy:
    """A `PolicyClient` whose turns come from a script.

    Each turn is `tokenizer.encode(text, add_special_tokens=False)` followed by the tokenizer's eos (`<|im_end|>`
    for the tiny model), with `finish_reason="stop"`. When the ids exceed `sampling.max_tokens` they are cut to that
    length (the eos is then lost) and `finish_reason` is `"length"`, as a model would be cut off. A script returning
    None yields just the eos.

    Args:
        tokenizer: The run's tokenizer, with an eos token (a `transformers` tokenizer or a
            `raygrpo.agent.chat_template.ChatTokenizer`: anything with `encode` and `eos_token_id`).
        script: `fn(context) -> str | None` (or an async function): the assistant's text for this turn.
        policy_version: The version reported on every turn (default `UNVERSIONED`: a script has no weights).
    """

    def __init__(self, tokenizer: Any, script: Script, policy_version: int = UNVERSIONED):
        if tokenizer.eos_token_id is None:
            raise ValueError("ScriptedPolicy needs a tokenizer with an eos token to end its turns")
        if not callable(script):
            raise TypeError(f"script must be callable, got {type(script).__name__}")
        self.tokenizer = tokenizer
        self.script = script
        self.eos_token_id: int = tokenizer.eos_token_id
        self._policy_version = policy_version

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self._policy_version = value

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext | None = None
    ) -> Turn:
        if context is None:
            context = GenerationContext(task=TaskRef(env="", index=-1))
        try:
            text = self.script(context)
            if inspect.isawaitable(text):
                text = await text
        except Exception as exc:
            # A broken script is the policy failing, not the environment: report it as such.
            name = getattr(self.script, "__qualname__", repr(self.script))
            raise PolicyError(f"script {name} raised {type(exc).__name__}: {exc}") from exc
        if text is not None and not isinstance(text, str):
            raise PolicyError(f"script returned {type(text).__name__}, expected str or None")
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []
        if not ids or ids[-1] != self.eos_token_id:
            ids.append(self.eos_token_id)
        finish_reason = "stop"
        if len(ids) > sampling.max_tokens:
            ids = ids[: sampling.max_tokens]
            finish_reason = "length"
        return Turn(
            output_ids=ids,
            logprobs=[0.0] * len(ids),
            finish_reason=finish_reason,
            policy_version=self._policy_version,
        )
