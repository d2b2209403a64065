"""Fault and latency injection settings of an environment spec (`faults:`), applied by `raygrpo.envs.harbor.faults`.

Pure data: the distributions sample from a `random.Random` they are given; `raygrpo.envs.harbor.faults` wraps a backend
and injects what these settings describe.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixedLatency(_Strict):
    """Always `value` seconds. Written `{"dist": "fixed", "value": 1.0}` (or just the number `1.0`)."""

    dist: Literal["fixed"] = "fixed"
    value: float = Field(ge=0)

    def sample(self, rng: random.Random) -> float:
        return self.value


class UniformLatency(_Strict):
    """Uniform between `low` and `high` seconds: `{"dist": "uniform", "low": 0.5, "high": 1.5}`."""

    dist: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> "UniformLatency":
        if self.high < self.low:
            raise ValueError(f"uniform latency needs low <= high, got low={self.low}, high={self.high}")
        return self

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)


class LogNormalLatency(_Strict):
    """Log-normal with the given `median` seconds and log-space `sigma`, optionally capped at `max_s`.

    `{"dist": "lognormal", "median": 0.5, "sigma": 0.8, "max_s": 10}`: a provider's create time, p50 0.5 s with
    multi-second tails.
    """

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    max_s: float | None = Field(default=None, gt=0)

    def sample(self, rng: random.Random) -> float:
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        return min(value, self.max_s) if self.max_s is not None else value


Latency = Annotated[FixedLatency | UniformLatency | LogNormalLatency, Field(discriminator="dist")]


class FaultConfig(_Strict):
    """What to inject around a sandbox backend. All rates are probabilities in [0, 1]; all defaults inject nothing.

    Args:
        start_latency_s (`float` or `dict`, *optional*):
            delay added before every `start()`: a number of seconds, or a distribution:
            `{"dist": "fixed", "value": s}`, `{"dist": "uniform", "low": a, "high": b}`, or
            `{"dist": "lognormal", "median": m, "sigma": s, "max_s": cap}` (cap optional).
        exec_latency_s (`float` or `dict`, *optional*):
            delay added before every exec, same schema (e.g. to make a no-op backend take time per tool call).
        verifier_latency_s (`float` or `dict`, *optional*):
            delay added, on top of `exec_latency_s`, to the exec that runs the verifier's test script (the one
            whose output Harbor's verifier sends to `/logs/verifier/test-stdout.txt`), same schema: a verifier that
            takes time on a backend whose commands take none.
        start_failure_rate (`float`, defaults to `0.0`):
            probability that `start()` fails (after its latency) before anything exists:
            `InjectedStartFailure`.
        post_start_failure_rate (`float`, defaults to `0.0`):
            probability that `start()` fails after the inner sandbox is up (as a failed healthcheck would); the
            wrapper stops the inner sandbox, then raises `InjectedPostStartFailure`.
        exec_hang_rate (`float`, defaults to `0.0`):
            probability, per exec, that it hangs until its timeout, then raises `InjectedExecTimeout`; the command
            is not run.
        exec_hang_s (`float`, defaults to `3600.0`):
            how long a hung exec without a `timeout_sec` hangs.
        death_rate (`float`, defaults to `0.0`):
            probability, per exec, that the sandbox dies just before it: that exec and all later operations raise
            `InjectedSandboxDeath`.
        seed (`int`, *optional*):
            base seed of every wrapper's draws (combined with the wrapper's key); None draws fresh randomness.
    """

    start_latency_s: float | Latency | None = None
    exec_latency_s: float | Latency | None = None
    verifier_latency_s: float | Latency | None = None
    start_failure_rate: float = Field(default=0.0, ge=0, le=1)
    post_start_failure_rate: float = Field(default=0.0, ge=0, le=1)
    exec_hang_rate: float = Field(default=0.0, ge=0, le=1)
    exec_hang_s: float = Field(default=3600.0, gt=0)
    death_rate: float = Field(default=0.0, ge=0, le=1)
    seed: int | None = None

    def injects_anything(self) -> bool:
        return bool(
            self.start_latency_s
            or self.exec_latency_s
            or self.verifier_latency_s
            or self.start_failure_rate
            or self.post_start_failure_rate
            or self.exec_hang_rate
            or self.death_rate
        )
