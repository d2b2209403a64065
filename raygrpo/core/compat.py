"""Every place where raygrpo reaches into another library's internals, each behind a check of the version it was
written for.

A patch of a private detail breaks silently when the library changes it. Each function here first checks the
installed version against the pin in `pyproject.toml` (`PINS`) and raises `CompatError` naming the pin when it
moved, so an upgrade fails loudly at the patch instead of misbehaving later.

- Ray: `keep_ray_on_loopback` turns off Ray's cluster mode constant so a local runtime stays on 127.0.0.1;
  `reload_ray_auth_config` makes this process see a `RAY_AUTH_MODE` / `RAY_AUTH_TOKEN` set after Ray loaded them.
- sse-starlette (pinned by openreward): `patch_sse_exit_signal` makes its shutdown watch per event loop.
- openreward's server: `set_ors_server_log_level`, `patch_ors_idle_timeout`, `ors_session_ids`.
- TRL: `GenerationOutputHook` overrides `GRPOTrainer._generate_and_score_completions` to adjust what it returns;
  `completion_logps` runs TRL's forward pass for a batch's log-probs; `log_trainer_metrics` adds to TRL's logged
  metrics; `sync_vllm_weights` pushes a trainer's weights to its vLLM server outside a generation batch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from packaging.specifiers import SpecifierSet

#: The versions the patches below were written against (keep in step with pyproject.toml).
PINS: dict[str, str] = {
    "ray": ">=2.60,<2.61",
    "sse-starlette": "==2.3.6",
    "openreward": "==0.1.167",
    "trl": ">=1.16,<1.17",
}


class CompatError(RuntimeError):
    """An installed library is not the version a raygrpo patch of its internals was written for."""


def require(dist: str, what: str) -> None:
    """Check that `dist` is installed at the version `PINS` names for it.

    Raises:
        CompatError: It is missing or another version; the message names the pin and the patch.
    """
    spec = PINS[dist]
    try:
        found = version(dist)
    except PackageNotFoundError:
        raise CompatError(f"{what} needs {dist}{spec}, which is not installed") from None
    if found not in SpecifierSet(spec):
        raise CompatError(f"{what} was written for {dist}{spec} (the pin in pyproject.toml), but {dist} {found} is "
                          "installed: reinstall the pinned version, or check raygrpo/core/compat.py against the new one")


# ── Ray ──────────────────────────────────────────────────────────────────────────────────────────────────────────


def keep_ray_on_loopback() -> None:
    """Keep a local Ray runtime on 127.0.0.1.

    Ray rewrites `127.0.0.1` to the machine's eth0 address unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, which it
    reads into `ray._private.ray_constants.ENABLE_RAY_CLUSTER` when `ray` is first imported; this sets the variable
    and, since `ray` may already be imported, the constant too.
    """
    require("ray", "keeping a local Ray on loopback (ray_constants.ENABLE_RAY_CLUSTER)")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


# ── sse-starlette ─────────────────────────────────────────────────────────────────────────────────────────────────

_SSE_PATCH_LOCK = threading.Lock()


def reload_ray_auth_config() -> None:
    """Reload Ray's native config and token cache from the environment, as Ray's own test utilities do
    (`ray._private.authentication_test_utils.reset_auth_token_state`): the config is read once per process, so a
    process that imported Ray before `RAY_AUTH_MODE` was set would otherwise connect to a token-authenticated
    runtime without its token."""
    require("ray", "reload_ray_auth_config")
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def patch_sse_exit_signal() -> None:
    """Make sse-starlette's shutdown watch per event loop, so several servers can run in one process.

    openreward pins sse-starlette 2.3.6, whose `EventSourceResponse` waits on ONE process-global `anyio.Event`
    (`AppStatus.should_exit_event`) bound to the loop that first waited on it. A second uvicorn server in the same
    process (another thread, or a later server after the first one stopped) then fails every SSE response
    (`/create_session`, `/call`) with "bound to a different event loop", cutting streams short. This swaps the watch
    for one event per running loop; a shutdown signal (`AppStatus.handle_exit`) still sets them all. Idempotent.
    """
    require("sse-starlette", "the per-loop shutdown watch of sse-starlette")
    import anyio
    from sse_starlette import sse

    with _SSE_PATCH_LOCK:
        if getattr(sse.EventSourceResponse._listen_for_exit_signal, "_raygrpo_per_loop", False):
            return
        events: dict[asyncio.AbstractEventLoop, anyio.Event] = {}
        original_handle_exit = sse.AppStatus.handle_exit

        async def listen_for_exit_signal() -> None:
            if sse.AppStatus.should_exit:
                return
            loop = asyncio.get_running_loop()
            event = events.get(loop)
            if event is None:
                for stale in [lp for lp in events if lp.is_closed()]:
                    events.pop(stale, None)
                event = events[loop] = anyio.Event()
            if sse.AppStatus.should_exit:
                return
            await event.wait()

        def handle_exit(*args: Any, **kwargs: Any) -> None:
            for loop, event in list(events.items()):
                if not loop.is_closed():
                    loop.call_soon_threadsafe(event.set)
            original_handle_exit(*args, **kwargs)

        listen_for_exit_signal._raygrpo_per_loop = True  # type: ignore[attr-defined]
        sse.EventSourceResponse._listen_for_exit_signal = staticmethod(listen_for_exit_signal)
        sse.AppStatus.handle_exit = staticmethod(handle_exit)
        from uvicorn.main import Server as UvicornServer

        if getattr(UvicornServer, "handle_exit", None) is original_handle_exit:
            UvicornServer.handle_exit = handle_exit  # type: ignore[method-assign]


# ── openreward's server ───────────────────────────────────────────────────────────────────────────────────────────

_LOG_LEVEL_LOCK = threading.Lock()


def set_ors_server_log_level(level: int | str) -> None:
    """Set the level of the openreward server's own structlog loggers (they print every request at INFO).

    The SDK fixes each logger's level when its module is imported (from `OPENREWARD_LOG_LEVEL`); this rebuilds the
    server, session and environment modules' loggers at `level`. Process-wide.
    """
    require("openreward", "setting the openreward server's log level")
    from openreward import log_utils
    from openreward.environments import environment as env_module
    from openreward.environments import server as server_module
    from openreward.environments import session as session_module

    name = logging.getLevelName(level) if isinstance(level, int) else str(level).upper()
    with _LOG_LEVEL_LOCK:
        saved = os.environ.get("OPENREWARD_LOG_LEVEL")
        os.environ["OPENREWARD_LOG_LEVEL"] = name
        try:
            server_module.logger = log_utils.get_logger("openreward.environments.server")
            session_module.logger = log_utils.get_logger("openreward.environments.session")
            env_module.logger = log_utils.get_logger("openreward.environments")
        finally:
            if saved is None:
                os.environ.pop("OPENREWARD_LOG_LEVEL", None)
            else:
                os.environ["OPENREWARD_LOG_LEVEL"] = saved


def patch_ors_idle_timeout(server: Any, idle_timeout_s: float, reaper_interval_s: float | None = None) -> None:
    """Change how long an openreward `Server` keeps a session that gets no ping or request (900 s by default).

    The server's reaper (`reaper_coro(reaper_interval=5, stale_threshold=900)`, a closure made in `Server.__init__`
    and started by the app's lifespan) deletes sessions whose last ping/request is older than the threshold. This
    rewrites the closure's defaults; call it before the server starts.
    """
    require("openreward", "changing the openreward server's idle timeout")
    lifespan = server.app.router.lifespan_context
    fn = getattr(lifespan, "__wrapped__", lifespan)
    cells = dict(zip(getattr(fn, "__code__").co_freevars, fn.__closure__ or ()))
    reaper = cells.get("reaper_coro")
    reaper_fn = reaper.cell_contents if reaper is not None else None
    if reaper_fn is None or reaper_fn.__code__.co_varnames[:2] != ("reaper_interval", "stale_threshold"):
        raise CompatError("cannot patch the idle timeout: openreward's Server has no reaper_coro(reaper_interval, "
                          "stale_threshold) in its lifespan")
    interval = reaper_interval_s if reaper_interval_s is not None else max(0.5, min(5.0, idle_timeout_s / 10))
    reaper_fn.__defaults__ = (float(interval), float(idle_timeout_s))


def ors_session_ids(server: Any) -> list[str]:
    """Ids of the sessions alive in an openreward `Server`'s own registry (its private `_active_envs`)."""
    return list(server._active_envs)


# ── TRL ───────────────────────────────────────────────────────────────────────────────────────────────────────────


class GenerationOutputHook:
    """Mixin for `trl.GRPOTrainer`: passes what TRL's private `_generate_and_score_completions` returns (the batch:
    ids, masks, advantages, old and sampling log-probs) through `adjust_generation_output` before TRL's loss sees it.

    Put it before `GRPOTrainer` in the bases and override `adjust_generation_output`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        require("trl", f"{cls.__name__} (overrides GRPOTrainer._generate_and_score_completions)")

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        return self.adjust_generation_output(output, inputs)

    def adjust_generation_output(self, output: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Return the batch to train on; the default leaves TRL's as it is. `inputs` are TRL's per-sample dicts, one
        per row of `output`, with the extra fields of the `rollout_func`'s output (e.g. `policy_version`) merged in."""
        return output


def completion_logps(trainer: Any, output: dict[str, Any], rows: Any) -> Any:
    """The trainer's per-token log-probs (no grad, current weights, at its temperature) of the completion tokens of
    `rows` of a generation output: the forward pass TRL makes for its own old log-probs, on those rows only. The
    columns (and so each row's padding) stay the batch's, so every position sees what TRL's loss will see."""
    require("trl", "computing the learner's log-probs of a generation batch")
    import torch
    from trl.models.utils import disable_gradient_checkpointing

    ids = torch.cat([output["prompt_ids"][rows], output["completion_ids"][rows]], dim=1)
    mask = torch.cat([output["prompt_mask"][rows], output["completion_mask"][rows]], dim=1)
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, output["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size,
        )
    return logps


def log_trainer_metrics(trainer: Any, metrics: dict[str, float | None]) -> None:
    """Add metrics of the current generation batch to those TRL averages into its next `log` (the logs a
    `TrainerCallback.on_log` receives); None is logged as NaN, which TRL reports as None."""
    require("trl", "adding metrics to a trainer's logs")
    mode = "train" if trainer.model.training else "eval"
    for name, value in metrics.items():
        trainer._metrics[mode][name].append(float("nan") if value is None else float(value))


def sync_vllm_weights(trainer: Any) -> None:
    """Push a `GRPOTrainer`'s weights to its vLLM server now, unless they are there already (TRL pushes them before
    each generation batch, when its private `_last_loaded_step` differs from the step), and record that it did, so
    TRL does not push them again."""
    require("trl", "syncing a trainer's weights to vLLM outside a generation batch")
    if getattr(trainer, "_last_loaded_step", None) == trainer.state.global_step:
        return
    trainer.vllm_generation.sync_weights()
    trainer._last_loaded_step = trainer.state.global_step
