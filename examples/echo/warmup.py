"""Format warm-up data for the echo environment (`train: {warmup: {examples: warmup.py:format_examples}}`).

The examples look exactly like echo episodes as the agent loop renders them: the same user prompt ("Echo '<target>'
to win. Call the echo tool with it."), the same `echo` tool schema the ORS server lists, and an assistant turn that is
one well-formed `echo` call. Two things keep them from teaching the echo tasks themselves:

- The prompt targets are one or two words from a list that shares no word with any train target, and never equal a
  test target, so no train or test task's prompt is ever seen.
- The answer is NOT the prompt's target: it is a string drawn uniformly at random from `ANSWERS`, independently of
  the prompt. The model learns the format (`<tool_call>` + JSON + `echo` + a short string + `<|im_end|>`) and a
  prompt-independent guess, so on a train task it is right about 1 time in len(ANSWERS) (~12%) — enough for GRPO
  to see rewards in a group — and whatever GRPO then gains (copying the target, or learning which task wants which
  string) it has to learn from the rewards. `ANSWERS` is the set of train answers, which the task list already makes
  public; which task wants which answer is never shown.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from raygrpo.agent.toolcalls import format_tool_call

#: The guesses the warm-up teaches (the train split's answer set), drawn uniformly, independent of the prompt.
ANSWERS = ["hello", "world", "hello world", "yes", "done", "the answer", "ok", "think step"]

#: Words of the warm-up prompts' targets: known to the tiny tokenizer, none of them in a train target. ("echo",
#: "repeat" and "this", words of the test targets, are kept so those prompts are not out of distribution; the exact
#: test targets are excluded below.)
PROMPT_WORDS = (
    "echo repeat this a an and or not is are was be to of in on for with as at by from that it you we they he she "
    "what which who how when where why no result number sum add subtract multiply divide reply text message tool "
    "call function arguments name value task solve compute please file read write list run bash command output "
    "error exit code test pass fail true false null user assistant system first then next finally because so"
).split()

#: Targets a warm-up prompt never has: the train and test targets of `EchoEnvironment`.
EXCLUDED_TARGETS = frozenset(ANSWERS + ["echo", "repeat this"])

#: The echo tool as `EchoEnvironment`'s ORS server lists it (checked against the real server in tests).
ECHO_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Submit a string. Reward 1.0 if it matches the target, else 0.0; either way the episode ends.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "The string to echo back."}},
            "required": ["text"],
        },
        "return": {"type": "string"},
    },
}


def prompt_text(target: str) -> str:
    """The echo environment's prompt for `target` (`EchoEnvironment.get_prompt`)."""
    return f"Echo '{target}' to win. Call the echo tool with it."


def format_examples(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` warm-up conversations: a disjoint echo prompt, the echo tool, and an echo call with a random answer.

    Prompt targets are one or two words of `PROMPT_WORDS` (like the train targets' shape), never one of
    `EXCLUDED_TARGETS`; the answer is `random.choice(ANSWERS)`, independent of the target. Each example also carries
    its prompt's `target` (for inspection; the warm-up ignores it). Deterministic in `seed`.
    """
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(n):
        target = "echo"
        while target in EXCLUDED_TARGETS:
            target = " ".join(rng.choice(PROMPT_WORDS) for _ in range(rng.choice((1, 2))))
        answer = rng.choice(ANSWERS)
        out.append({
            "messages": [{"role": "user", "content": prompt_text(target)}],
            "tools": [copy.deepcopy(ECHO_TOOL)],
            "completion": format_tool_call("echo", {"text": answer}),
            "target": target,
        })
    return out
