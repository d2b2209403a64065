"""Environment variables every raygrpo process sets for the libraries underneath (driver and actors alike), and the
log level that `-v` gives the driver, carried to the actors (they are other processes, on other nodes)."""

from __future__ import annotations

import logging
import os

#: Variables every raygrpo process should see; the user's own values win.
PROCESS_ENV: dict[str, str] = {
    # The openreward SDK otherwise asks PyPI for a newer version on every client it builds.
    "OPENREWARD_DISABLE_UPDATE_CHECK": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Ray runs async actors on uvloop whenever it is installed (vLLM's dependencies install it). raygrpo's sandboxes
    # manage their processes through asyncio's own subprocess and child-watcher semantics, which it was built and
    # tested on; under uvloop, sandbox stops under load failed ("'str' object cannot be interpreted as an integer")
    # and left folders behind.
    "RAY_USE_UVLOOP": "0",
}


#: The level (a `logging` name) raygrpo's processes log at: the driver sets it from `-v`; the runtime_env of the
#: job and of the learner carry it to the actors, whose `apply_process_env` applies it.
LOG_LEVEL_ENV = "RAYGRPO_LOG_LEVEL"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(verbose: bool) -> None:
    """The driver's logging: INFO with `-v`, else WARNING; the level goes to `LOG_LEVEL_ENV` for the actors."""
    level = "INFO" if verbose else "WARNING"
    os.environ[LOG_LEVEL_ENV] = level
    logging.basicConfig(level=level, format=LOG_FORMAT)


def log_env() -> dict[str, str]:
    """`LOG_LEVEL_ENV` as a runtime_env's `env_vars`, where this process has it."""
    return {LOG_LEVEL_ENV: os.environ[LOG_LEVEL_ENV]} if LOG_LEVEL_ENV in os.environ else {}


def apply_process_env() -> None:
    """Set `PROCESS_ENV` in this process where the user has not set the variables already, and log at the level
    `LOG_LEVEL_ENV` names where it is set (an actor started by a driver run with `-v` logs its INFO lines)."""
    for key, value in PROCESS_ENV.items():
        os.environ.setdefault(key, value)
    level = os.environ.get(LOG_LEVEL_ENV)
    if level:
        logging.basicConfig(format=LOG_FORMAT)
        logging.getLogger().setLevel(level)
