"""The learner's checkpoints: raygrpo's own state saved next to each of TRL's, and finding the one to resume from.

TRL saves the model, optimizer and its own trainer state in `checkpoints/checkpoint-<step>/`; raygrpo adds
`raygrpo_state.json` there (the task schedule's position, the stale groups dropped so far), so a resumed run
continues with the next task. It is the last file of a save, written before transformers deletes older checkpoints
(`raygrpo.train.trainer.RolloutGRPOTrainer._save_checkpoint`): a folder without it, or without TRL's
`trainer_state.json`, is a save that a kill cut short, and `--resume` takes the newest complete checkpoint instead.
A resumed run also reports a fingerprint of the optimizer state it loaded, which a test compares with the one the
interrupted run saved.

No transformers import here: the driver checks that a run can be resumed before Ray starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from raygrpo.core.errors import ResolveError

logger = logging.getLogger(__name__)

STATE_FILE = "raygrpo_state.json"
#: transformers' trainer state in a checkpoint (`TRAINER_STATE_NAME`), written after the model and optimizer.
TRAINER_STATE_FILE = "trainer_state.json"
#: transformers' checkpoint folders (`PREFIX_CHECKPOINT_DIR`, `trainer_utils._re_checkpoint`).
CHECKPOINT_PREFIX = "checkpoint"
_CHECKPOINT = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)$")
#: Where a warmed-up model is saved in the run folder: the start of GRPO, and its KL reference (also on resume).
REFERENCE_DIR = "reference"


def optimizer_fingerprint(state: dict[str, Any]) -> str:
    """A hash of an optimizer `state_dict()["state"]` (per-parameter moments and step counts), to check a resume."""
    import torch

    digest = hashlib.sha256()
    for key in sorted(state, key=str):
        for name in sorted(state[key]):
            value = state[key][name]
            if torch.is_tensor(value):
                data = value.detach().cpu().contiguous().float().numpy().tobytes()
            else:
                data = repr(value).encode()
            digest.update(f"{key}/{name}".encode())
            digest.update(data)
    return digest.hexdigest()[:16]


def missing_parts(folder: Path) -> list[str]:
    """The files a complete checkpoint has and `folder` lacks (empty: it can be resumed from)."""
    return [name for name in (TRAINER_STATE_FILE, STATE_FILE) if not (folder / name).is_file()]


def find_checkpoint(checkpoints: Path, resume: bool, *, warn: bool = True) -> str | None:
    """The newest complete checkpoint under `checkpoints` when `resume`ing (see `missing_parts`); each newer one
    that a kill left incomplete is skipped, with a warning naming it (`warn`), and so is the absence of any
    checkpoint (None: the run starts from scratch).

    Raises:
        ResolveError: There are checkpoints and none is complete: starting afresh would silently throw away the
            run, so the folder is named for the user to decide.
    """
    if not resume:
        return None
    folders = sorted((p for p in checkpoints.iterdir() if p.is_dir() and _CHECKPOINT.match(p.name)),
                     key=lambda p: int(_CHECKPOINT.match(p.name).group(1)), reverse=True) \
        if checkpoints.is_dir() else []
    for folder in folders:
        missing = missing_parts(folder)
        if not missing:
            return str(folder)
        if warn:
            logger.warning("--resume: skipping %s, a save cut short (no %s); resuming from an older checkpoint",
                           folder, " or ".join(missing))
    if folders:
        raise ResolveError(f"--resume: no complete checkpoint under {checkpoints}: "
                           + "; ".join(f"{f.name} lacks {', '.join(missing_parts(f))}" for f in folders)
                           + " (saves cut short): rerun without --resume to start afresh")
    if warn:
        logger.warning("--resume: no checkpoint under %s; starting from scratch", checkpoints)
    return None


def checkpoint_folder(output_dir: str | Path, step: int) -> Path:
    """The folder transformers saves the checkpoint of optimizer `step` in (`<output_dir>/checkpoint-<step>`)."""
    return Path(output_dir) / f"{CHECKPOINT_PREFIX}-{step}"


def checkpoint_step(checkpoint: str) -> int:
    """The optimizer step a checkpoint folder (`checkpoint-<step>`) was saved at."""
    return int(checkpoint.rsplit("-", 1)[1])


def read_state(checkpoint: str | None) -> dict[str, Any]:
    """raygrpo's state saved with `checkpoint` (empty for a fresh run)."""
    return json.loads((Path(checkpoint) / STATE_FILE).read_text()) if checkpoint else {}


def write_state(folder: Path, *, step: int, policy_version: int, schedule: dict[str, Any],
                dropped_groups_total: int, reference: bool, zero_variance_groups_total: int = 0,
                outcomes: dict[str, Any] | None = None) -> None:
    """Save raygrpo's state in the checkpoint `folder` TRL just wrote (if it did), through a temporary file so that
    the state file exists only whole (its presence marks the checkpoint complete). `reference`: whether the run
    started GRPO from a warmed model saved in `OUT/reference` (its KL reference). `outcomes`: how the rollouts
    consumed so far ended (`Outcomes.state_dict`), which a resumed run continues counting from."""
    if folder.is_dir():
        partial = folder / f".{STATE_FILE}.tmp"
        partial.write_text(json.dumps({
            "step": step,
            "policy_version": policy_version,
            "schedule": schedule,
            "dropped_groups_total": dropped_groups_total,
            "zero_variance_groups_total": zero_variance_groups_total,
            "reference": reference,
            "outcomes": outcomes,
        }))
        os.replace(partial, folder / STATE_FILE)


def uses_reference(saved: dict[str, Any], reference: Path) -> bool:
    """Whether the run a checkpoint's state (`saved`) belongs to started from the warmed model in `reference`. Its
    record decides, not whether the folder exists (a reused output folder may hold another run's); a checkpoint
    from before the record was kept falls back to the folder, with a warning. Raises `FileNotFoundError` when the
    record says the run was warmed and the folder is gone."""
    if "reference" not in saved:
        if reference.is_dir():
            logger.warning("the checkpoint does not record whether its run was warmed up; using %s as its start "
                           "because it exists", reference)
        return reference.is_dir()
    if saved["reference"] and not reference.is_dir():
        raise FileNotFoundError(f"the run being resumed started GRPO from a warmed-up model in {reference}, which is "
                                "gone: its KL reference cannot be rebuilt")
    return bool(saved["reference"])
