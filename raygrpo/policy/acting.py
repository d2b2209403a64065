"""Built-in policies that act on the environment directly instead of writing text: `oracle` and `noop`.

They do what Harbor's `oracle` and `nop` agents do. The oracle runs the task's reference solution through the
adapter (`SolutionRunner.run_solution`: Harbor's `solution/solve.sh`, uploaded to `/solution` and run from the
working directory); noop does nothing, so the verifier judges the untouched sandbox. The agent loop
(`raygrpo.agent.rollout`) gives them the started adapter instead of a conversation, records what they did as a step, and
has the episode scored as usual. They need no model, tokenizer or engine, serve `raygrpo rollout` and
`raygrpo check`, and `raygrpo train` refuses them (there is nothing to train on).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from raygrpo.envs.base import SolutionRunner
from raygrpo.core.errors import TaskError
from raygrpo.core.types import SOLUTION_STEP, UNVERSIONED, ToolResult

__all__ = ["ActingPolicy", "NoopPolicy", "OraclePolicy", "acting_policy"]


@runtime_checkable
class ActingPolicy(Protocol):
    """A policy that acts on the started environment once, in place of the model's turns.

    `act` returns the `ToolResult` of what it did (recorded as a step named `step`), or None when it did nothing.
    It raises what the adapter raises: `TaskError`, `TimeoutError`, `EnvError`.
    """

    kind: str
    step: str

    @property
    def policy_version(self) -> int: ...

    async def act(self, adapter: Any) -> ToolResult | None: ...


class OraclePolicy:
    """Runs the task's reference solution in the episode's environment (Harbor's oracle agent).

    The environment must be able to run one (`raygrpo.envs.base.SolutionRunner`: Harbor tasks); for one that
    cannot, `act` raises `TaskError` (the resolve step refuses such configs before Ray starts).
    """

    kind = "oracle"
    step = SOLUTION_STEP

    @property
    def policy_version(self) -> int:
        return UNVERSIONED

    async def act(self, adapter: Any) -> ToolResult:
        if not isinstance(adapter, SolutionRunner):
            raise TaskError(f"the oracle policy runs a task's reference solution, and {type(adapter).__name__} "
                            "environments have none (use it with Harbor tasks)")
        return await adapter.run_solution()


class NoopPolicy:
    """Does nothing: the verifier judges the environment as it started (Harbor's nop agent)."""

    kind = "noop"
    step = "(noop)"

    @property
    def policy_version(self) -> int:
        return UNVERSIONED

    async def act(self, adapter: Any) -> None:
        return None


#: The acting policies by `policy.kind`.
ACTING_POLICIES: dict[str, type] = {"oracle": OraclePolicy, "noop": NoopPolicy}


def acting_policy(kind: str) -> ActingPolicy:
    """A new acting policy of `kind` (`"oracle"` or `"noop"`).

    Raises:
        ValueError: `kind` names no acting policy.
    """
    try:
        return ACTING_POLICIES[kind]()
    except KeyError:
        raise ValueError(f"no acting policy {kind!r} (known: {', '.join(ACTING_POLICIES)})") from None
