"""A local `.gguf` file as a plain Hugging Face model folder, dequantized once and cached.

transformers reads GGUF checkpoints itself (`from_pretrained(folder, gguf_file=...)`, which needs the `gguf` package)
and dequantizes their weights to float tensors; the chat template and tokenizer come from the file's metadata. raygrpo
does that once per file and saves the result with `save_pretrained`, so every later load (the learner, each engine
actor) is an ordinary model folder: no `gguf` import, no 30-second dequantization per process.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from raygrpo.policy.model_cache import build_atomically, is_complete

logger = logging.getLogger(__name__)

#: Bump when the converted folder's layout changes, so older caches are not reused.
GGUF_CACHE_VERSION = "v1"
#: The optional dependency that reads GGUF files, and the extra that installs it.
GGUF_EXTRA = "gguf"


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require_gguf() -> None:
    """Fail with a message naming the `gguf` extra when the `gguf` package is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(
            f"reading a .gguf model needs the 'gguf' package: pip install 'raygrpo[{GGUF_EXTRA}]' "
            f"(or pip install gguf)"
        ) from exc


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> str:
    """Dequantize one GGUF file into a Hugging Face model folder `out_dir` (model, tokenizer, chat template).

    Args:
        gguf_path: The `.gguf` file.
        out_dir: Folder to write; it loads with `AutoModelForCausalLM.from_pretrained(out_dir)`.
    """
    require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(gguf_path)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        if getattr(quantizer, "packed_modules", None):  # GGUF blocks kept for a matmul kernel: not trainable
            raise RuntimeError(f"{path}: transformers kept its weights packed; raygrpo needs them dequantized")
        quantizer.remove_quantization_config(model)  # the weights are plain float tensors now
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("Dequantized %s (%d parameters, vocab %d) into %s", path.name, n_params, len(tok), out_dir)
    return str(out_dir)


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    """The sha256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def ensure_gguf_model(gguf_path: str | os.PathLike, cache_root: Path, name: str | None = None) -> str:
    """The cached Hugging Face folder of a `.gguf` file, converted once.

    The folder is `<cache_root>/gguf-<GGUF_CACHE_VERSION>-<name>`, where `name` defaults to the file's stem and the
    first 12 hex digits of its sha256 (a changed file is converted again).

    Args:
        gguf_path: The `.gguf` file.
        cache_root: Where raygrpo caches built models (beside the tiny model).
        name: The cache folder's name, for files whose identity is known without hashing them.
    """
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    if name is None:
        name = f"{path.stem}-{file_digest(path)[:12]}"
    final = Path(cache_root) / f"gguf-{GGUF_CACHE_VERSION}-{name}"
    if is_complete(final):
        return str(final)
    require_gguf()
    logger.info("Converting %s to a Hugging Face folder (once; cached in %s)", path, final)
    return str(build_atomically(final, lambda tmp: convert_gguf(path, tmp)))
