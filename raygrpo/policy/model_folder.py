"""What a local model folder must hold before engines load it, and the context length its `config.json` declares.

The driver checks a run's `model` folder here before Ray starts: a folder without a `config.json` or a tokenizer (a
run folder instead of its `model/`, a Hugging Face hub cache folder whose files sit under `snapshots/<rev>/`) would
otherwise pass, and every engine actor would die in its `__init__` with the cause only in Ray's logs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Files any one of which lets `AutoTokenizer.from_pretrained` build a tokenizer from a folder: the fast tokenizer,
#: its config, or the vocabulary files of the slow tokenizers (BPE, SentencePiece, WordPiece).
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "vocab.txt",
)

#: `config.json` keys vLLM reads a model's context length from (`vllm.config.model._get_and_verify_max_len`); the
#: smallest one present wins, as there.
CONTEXT_KEYS: tuple[str, ...] = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length", "max_seq_length",
    "seq_len",
)


def check_model_folder(path: str) -> None:
    """Refuse a folder that is not a Hugging Face model folder: no `config.json`, or nothing a tokenizer loads from.

    Raises:
        FileNotFoundError: The message says what is missing and, where the folder holds a model one level down
            (`model/`, `snapshots/<rev>/`), names that folder.
    """
    folder = Path(path)
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("no config.json")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"no tokenizer ({', '.join(TOKENIZER_FILES[:2])} or vocabulary files)")
    if not missing:
        return
    hint = ""
    inner = _model_inside(folder)
    if inner is not None:
        hint = f"; it holds a model folder at {str(inner)!r}: give that path"
    raise FileNotFoundError(f"{path!r} is not a model folder (saved with save_pretrained): it has "
                            f"{' and '.join(missing)}{hint}")


def _model_inside(folder: Path) -> Path | None:
    """A model folder one level down: a run's `model/`, or a hub cache's newest `snapshots/<rev>/`."""
    if (folder / "model" / "config.json").is_file():
        return folder / "model"
    snapshots = [p.parent for p in folder.glob("snapshots/*/config.json")]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def declared_context(path: str) -> tuple[int, str] | None:
    """The context length a model folder's `config.json` declares and the key it came from, as vLLM reads it when
    no `max_model_len` is given; None where it cannot be told for sure (no such key, or a `rope_scaling` that vLLM
    stretches the context by)."""
    try:
        config: dict[str, Any] = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config
    if config.get("rope_scaling") or (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        return None
    found = [(int(config[k]), k) for k in CONTEXT_KEYS if isinstance(config.get(k), int) and config[k] > 0]
    return min(found) if found else None
