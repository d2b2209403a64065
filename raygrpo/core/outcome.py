"""How a run went: the statuses its rollouts ended with, why the failed ones failed, and whether the run failed.

DESIGN section 7's exit codes: a run that completed exits 0, unless it failed: no rollout was scored while some failed
for an infrastructure reason or met a broken task (`task_error`: a run of nothing else trained or measured nothing),
or more than `fail_fraction` of its rollouts failed (a broken task among working ones does not count there: it is the
suite's, reported among the causes). `Outcomes` collects the final
trajectories (`rollout` counts every requested rollout, `train` every consumed one); `verdict` judges them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raygrpo.core.types import Status, Trajectory

#: How many causes the console and the summary list.
TOP_CAUSES = 5

_NUMBER = re.compile(r"\b\d+(\.\d+)?\b")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE)
_HEX_ID = re.compile(r"\b[0-9a-f]{8,}\b")
_URL_PORT = re.compile(r"(https?://[^/:\s]+):\d+")


def without_ids(error: str) -> str:
    """An error message with its ids (UUIDs such as an ORS session's sid, long hex ids such as a sandbox's name)
    replaced by `ID`: what differs between two attempts that failed the same way."""
    return _HEX_ID.sub("ID", _UUID.sub("ID", error))


def cause_of(error: str | None) -> str:
    """An error message with what varies between otherwise identical failures (numbers, ids, ports) replaced, so
    that the same failure of many rollouts counts as one cause."""
    text = error or "(no message)"
    text = _URL_PORT.sub(r"\1:PORT", text)
    return _NUMBER.sub("N", without_ids(text))


@dataclass
class Outcomes:
    """Final statuses of a run's rollouts, and the causes of its failures with one example message each."""

    status_counts: Counter = field(default_factory=Counter)
    scored: int = 0
    _causes: Counter = field(default_factory=Counter)
    _examples: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, traj: Trajectory) -> None:
        self.status_counts[traj.status.value] += 1
        if traj.reward is not None:
            self.scored += 1
        if traj.status.is_failure or traj.status is Status.TASK_ERROR:
            key = (traj.status.value, cause_of(traj.error))
            self._causes[key] += 1
            self._examples.setdefault(key, traj.error or "")

    def state_dict(self) -> dict[str, Any]:
        """The counts and causes as JSON: a training checkpoint keeps them, so that a resumed run reports the whole
        run's and not only its own part's."""
        return {"status_counts": dict(self.status_counts), "scored": self.scored,
                "causes": [[s, c, n, self._examples[(s, c)]] for (s, c), n in self._causes.items()]}

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> Outcomes:
        """Outcomes from `state_dict()`'s JSON; empty for None (a fresh run)."""
        out = cls()
        if state:
            out.status_counts.update(state.get("status_counts") or {})
            out.scored = int(state.get("scored") or 0)
            for status, cause, count, example in state.get("causes") or []:
                out._causes[(status, cause)], out._examples[(status, cause)] = count, example
        return out

    def fields(self) -> dict[str, Any]:
        """What a summary reports of them: `status_counts`, `scored`, `failure_causes`."""
        return {"status_counts": dict(sorted(self.status_counts.items())), "scored": self.scored,
                "failure_causes": self.causes()}

    def causes(self, top: int = TOP_CAUSES) -> list[dict[str, Any]]:
        """The most frequent failure causes (broken tasks', `task_error`, too): `{status, cause, count, example}`, most
    frequent first."""
        return [{"status": status, "cause": cause, "count": count, "example": self._examples[(status, cause)]}
                for (status, cause), count in self._causes.most_common(top)]


@dataclass
class Verdict:
    """Whether a completed run failed, and why (one line)."""

    failed: bool
    reason: str = ""


def verdict(status_counts: Mapping[str, int], scored: int, fail_fraction: float) -> Verdict:
    """Judge a completed run by DESIGN section 7's rule (see the module docstring), from its status counts and the
    number of scored rollouts (as `summary.json` reports them)."""
    total = sum(status_counts.values())
    failed = sum(n for status, n in status_counts.items() if Status(status).is_failure)
    broken = status_counts.get(Status.TASK_ERROR.value, 0)
    if failed and not scored:
        return Verdict(True, f"no rollout was scored and {failed} of {total} failed")
    if broken and not scored:
        return Verdict(True, f"no rollout was scored and {broken} of {total} met a broken task (task_error)")
    if total and failed / total > fail_fraction:
        return Verdict(True, f"{failed} of {total} rollouts failed, more than fail_fraction={fail_fraction:g}")
    return Verdict(False)


def starved_step(trajs: list[Trajectory], fail_fraction: float) -> str | None:
    """Why a training step's batch must not be trained on (None when it may): none of its rollouts was scored and
    more than `fail_fraction` of them failed (`Status.is_failure`: infrastructure, a hung scorer). Such a step would
    train on nothing (every advantage 0) and its checkpoint would count its tasks done, as every later one would
    once an environment's server is gone for good; the learner stops the run instead (exit 1), naming the cause."""
    outcomes = Outcomes()
    for traj in trajs:
        outcomes.add(traj)
    total = len(trajs)
    failed = sum(n for status, n in outcomes.status_counts.items() if Status(status).is_failure)
    if outcomes.scored or not total or failed / total <= fail_fraction:
        return None
    top = outcomes.causes(1)
    cause = f"; top cause: {top[0]['count']} {top[0]['status']}, e.g. {top[0]['example']}" if top else ""
    return (f"no rollout of the step's batch was scored and {failed} of {total} failed, more than fail_fraction="
            f"{fail_fraction:g}{cause}")


def report(status_counts: dict[str, int], causes: list[dict[str, Any]]) -> str:
    """The lines the console shows at the end of a run: status counts, then the top failure causes."""
    lines = ["status: " + (", ".join(f"{s} {n}" for s, n in sorted(status_counts.items(), key=lambda kv: -kv[1]))
                           or "no rollouts")]
    if causes:
        lines.append("top failure causes:")
        for c in causes:
            lines.append(f"  {c['count']:>5}  {c['status']:<13} {c['cause']}")
            if c["example"] != c["cause"]:
                lines.append(f"  {'':>5}  {'':<13} e.g. {c['example']}")
    return "\n".join(lines)
