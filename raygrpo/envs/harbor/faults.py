"""Fault and latency injection around any Harbor `BaseEnvironment` (local, docker, e2b, ... or the null backend).

The benchmarks and the reliability tests use it to make a fast, reliable backend behave like a slow, flaky provider,
so that the same tests run against the local backend now and a real backend later:

    env = EnvironmentFactory.create_environment_from_config(...)
    env = wrap_environment(env, FaultConfig(start_latency_s={"dist": "lognormal", "median": 0.5, "sigma": 0.6},
                                            start_failure_rate=0.1, post_start_failure_rate=0.1, seed=0))

Every fault is a clear exception (or a clear delay) raised where the real failure would surface:

- start latency: `start()` sleeps first, as a slow provider's create would; exec and verifier latency likewise
  before an exec (the verifier's on the exec that runs the task's test script);
- `InjectedStartFailure`: `start()` fails before anything exists (nothing to stop);
- `InjectedPostStartFailure`: the inner sandbox started, then "its healthcheck failed": the wrapper stops the inner
  sandbox itself before raising, so nothing leaks even when the caller does not call `stop()`;
- `InjectedExecTimeout`: an exec "hangs" (the command is not run) until its `timeout_sec` (or `exec_hang_s` when it
  has none), then raises the way Harbor's docker backend reports a timeout (a `RuntimeError`,
  `Command timed out after N seconds`);
- `InjectedSandboxDeath`: the sandbox "dies" just before an exec: that exec and every later exec, upload and
  download raise, as they would against a dead container; `stop()` still stops the inner sandbox.

Random decisions are reproducible: each wrapper draws from its own stream seeded by `(FaultConfig.seed, key)`, where
`key` defaults to the inner environment's `session_id`; pass a stable key (task index, group member, attempt) for
runs that replay exactly. With `seed=None` the draws are fresh on every run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.trial.paths import EnvironmentPaths

from raygrpo.specs.faults import FaultConfig, FixedLatency, LogNormalLatency, UniformLatency

logger = logging.getLogger(__name__)


def _latency(value: float | FixedLatency | UniformLatency | LogNormalLatency | None, rng: random.Random) -> float:
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return value.sample(rng)


class InjectedFault(RuntimeError):
    """Base class of every injected failure."""


class InjectedStartFailure(InjectedFault):
    """Injected: the sandbox failed to start; nothing was created."""


class InjectedPostStartFailure(InjectedStartFailure):
    """Injected: the sandbox started, then failed its healthcheck; the wrapper already stopped it."""


class InjectedExecTimeout(InjectedFault):
    """Injected: the exec hung until its timeout (message as Harbor's docker backend: `Command timed out ...`)."""


class InjectedSandboxDeath(InjectedFault):
    """Injected: the sandbox died mid-episode; it cannot run anything any more."""


#: Where Harbor's verifier sends the output of the task's test script: it names the exec that runs the verifier.
_VERIFIER_OUTPUT = str(EnvironmentPaths.verifier_dir / "test-stdout.txt")

# Methods of BaseEnvironment that the wrapper implements itself (the fault surface).
_OWN = frozenset(
    {"start", "stop", "exec", "upload_file", "upload_dir", "download_file", "download_dir", "_validate_definition"}
)
# Other BaseEnvironment methods/properties: when the inner class overrides one, the inner's version is used;
# otherwise BaseEnvironment's runs on the wrapper, so its internal execs go through the fault surface.
# BaseEnvironment's plain class-level data (e.g. `context_id = None`) is always read from the inner.
_BASE_METHODS: set[str] = set()
_BASE_DATA: set[str] = set()
for _klass in BaseEnvironment.__mro__[:-1]:
    for _name, _value in vars(_klass).items():
        if _name.startswith("__") or _name in _OWN:
            continue
        if callable(_value) or hasattr(_value, "__get__"):
            _BASE_METHODS.add(_name)
        else:
            _BASE_DATA.add(_name)
_WRAPPER_FIELDS = frozenset({"_inner", "_faults", "_rng", "_dead", "_inner_started", "_stopped", "key"})


class FaultInjectingEnvironment(BaseEnvironment):
    """A `BaseEnvironment` that injects faults and latency around another one, and delegates everything else.

    It is a `BaseEnvironment` (Harbor's verifier and trial code accept it), without an environment of its own:
    attributes (`session_id`, `task_env_config`, `default_user`, `logger`, ...) are read from and written to the
    inner environment, and the inner class's own methods are used wherever it overrides Harbor's defaults.

    Args:
        inner (`BaseEnvironment`): the environment to wrap (any backend).
        faults (`FaultConfig`): what to inject.
        key (`str`, *optional*): the key of this wrapper's random stream (default: the inner `session_id`).
    """

    def __init__(self, inner: BaseEnvironment, faults: FaultConfig, key: str | None = None):
        # BaseEnvironment.__init__ is deliberately not called: the inner environment holds all the state.
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_faults", faults)
        object.__setattr__(self, "key", key if key is not None else str(getattr(inner, "session_id", "")))
        object.__setattr__(self, "_rng", _stream(faults.seed, self.key))
        object.__setattr__(self, "_dead", False)
        object.__setattr__(self, "_inner_started", False)
        object.__setattr__(self, "_stopped", False)

    # ---------------------------------------------------------------- delegation

    def __getattribute__(self, name: str) -> Any:
        if name in _BASE_METHODS:
            inner = object.__getattribute__(self, "_inner")
            if name == "type" or getattr(type(inner), name, None) is not getattr(BaseEnvironment, name, None):
                return getattr(inner, name)
        elif name in _BASE_DATA:
            return getattr(object.__getattribute__(self, "_inner"), name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_inner"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WRAPPER_FIELDS:
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)

    @property
    def inner(self) -> BaseEnvironment:
        """The wrapped environment."""
        return self._inner

    @property
    def faults(self) -> FaultConfig:
        return self._faults

    @staticmethod
    def type() -> str:  # instances answer the inner's type (see __getattribute__)
        return "fault-injecting"

    def _validate_definition(self) -> None:  # never called: the inner validated its definition
        pass

    # ---------------------------------------------------------------- the fault surface

    async def start(self, force_build: bool) -> None:
        f = self._faults
        delay = _latency(f.start_latency_s, self._rng)
        fail_before = self._rng.random() < f.start_failure_rate
        fail_after = self._rng.random() < f.post_start_failure_rate
        if delay > 0:
            await asyncio.sleep(delay)
        if fail_before:
            raise InjectedStartFailure(f"injected start failure (sandbox {self.key!r}; nothing was created)")
        # Marked before the await: a real start that fails half-way is still stopped by the wrapper's stop().
        self._inner_started = True
        await self._inner.start(force_build)
        if fail_after:
            try:
                await self._inner.stop(delete=True)
            finally:
                self._stopped = True
            raise InjectedPostStartFailure(
                f"injected failure after start (sandbox {self.key!r} came up, then failed its healthcheck; "
                "it was stopped)"
            )

    async def stop(self, delete: bool = True) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._inner_started:
            await self._inner.stop(delete)

    def _check_alive(self) -> None:
        if self._dead:
            raise InjectedSandboxDeath(f"sandbox {self.key!r} is dead (injected death)")

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        f = self._faults
        self._check_alive()
        dies = self._rng.random() < f.death_rate
        hangs = self._rng.random() < f.exec_hang_rate
        delay = _latency(f.exec_latency_s, self._rng)
        if f.verifier_latency_s is not None and _VERIFIER_OUTPUT in command:
            delay += _latency(f.verifier_latency_s, self._rng)
        if dies:
            self._dead = True
            logger.debug("injected death of sandbox %r", self.key)
            raise InjectedSandboxDeath(f"sandbox {self.key!r} died (injected death)")
        if delay > 0:
            await asyncio.sleep(delay)
        if hangs:
            await asyncio.sleep(timeout_sec if timeout_sec else f.exec_hang_s)
            raise InjectedExecTimeout(f"Command timed out after {timeout_sec or f.exec_hang_s} seconds")
        return await self._inner.exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self._check_alive()
        await self._inner.upload_file(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        self._check_alive()
        await self._inner.upload_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        self._check_alive()
        await self._inner.download_file(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        self._check_alive()
        await self._inner.download_dir(source_dir, target_dir)


def _stream(seed: int | None, key: str) -> random.Random:
    if seed is None:
        return random.Random()
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def wrap_environment(
    env: BaseEnvironment, faults: FaultConfig | dict | None, key: str | None = None
) -> BaseEnvironment:
    """`env` wrapped in a `FaultInjectingEnvironment`, or `env` itself when `faults` is None or injects nothing.

    Args:
        env: any Harbor environment.
        faults: a `FaultConfig`, its dict form (validated), or None.
        key: the wrapper's random-stream key (default: `env.session_id`).
    """
    if faults is None:
        return env
    if isinstance(faults, dict):
        faults = FaultConfig.model_validate(faults)
    if not faults.injects_anything():
        return env
    return FaultInjectingEnvironment(env, faults, key=key)
