"""`raygrpo export`: a run's trajectories as Parquet, a Hugging Face dataset, or Harbor ATIF files.

The trajectories are streamed from the JSON lines file (`raygrpo.export.lines`) into the output, so memory stays
bounded by a row group (Parquet, HF) or one trajectory (ATIF) whatever the size of the run. The output is written
under a temporary name next to its destination and renamed into place once complete: an export that fails or is
interrupted leaves nothing that looks finished, and one killed outright leaves a hidden folder that the next export
of the same output removes.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.metadata
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from raygrpo.export.lines import ExportError, Line, ReadStats, Source, find_source, read_lines

logger = logging.getLogger(__name__)

#: Reasons kept in a report for trajectories ATIF left out (the rest are counted).
LEFT_OUT_EXAMPLES = 5


class ExportFormat(str, enum.Enum):
    """An output format: `parquet` (one file), `hf` (a `datasets.save_to_disk` folder), `atif` (a folder of
    Harbor ATIF `.json` files, one per trajectory)."""

    PARQUET = "parquet"
    HF = "hf"
    ATIF = "atif"


class ExportOptions(BaseModel):
    """What to export, where.

    Args:
        path: A run folder (its `trajectories.jsonl`, or a training run's `rollouts.jsonl`) or the JSON lines file.
        format: The output format.
        out: Where to write; by default next to the JSON lines file, named after it: `trajectories.parquet`,
            `trajectories.hf/`, `trajectories.atif/` (`rollouts.*` for a training run).
        overwrite: Replace `out` if it exists (otherwise that is an error).
        model_name: ATIF: the agent's `model_name` (a run folder does not record its model).
        progress: Show a progress bar on stderr.
    """

    model_config = ConfigDict(extra="forbid")

    path: Path
    format: ExportFormat
    out: Path | None = None
    overwrite: bool = False
    model_name: str | None = None
    progress: bool = False


@dataclass
class ExportReport:
    """How an export went.

    Args:
        source: The JSON lines file read.
        format: The output format.
        out: What was written.
        lines: Complete trajectory lines read.
        written: Trajectories written (rows, or ATIF files).
        seconds: Wall-clock time of the export.
        truncation_note: One line on a cut-off last line that was left out, if any.
        older_schema: The oldest older `schema_version` met, if any.
        left_out: ATIF: trajectories not written (nothing ATIF can hold), with `left_out_examples` saying why.
        left_out_examples: `line N: reason` for the first few of them.
    """

    source: Path
    format: ExportFormat
    out: Path
    lines: int
    written: int
    seconds: float
    truncation_note: str | None = None
    older_schema: int | None = None
    left_out: int = 0
    left_out_examples: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        """One line per thing the user should know beside the count: a cut-off last line, older lines, ATIF's
        leftovers."""
        out = [self.truncation_note] if self.truncation_note else []
        if self.older_schema is not None:
            out.append(f"{self.source.name}: some lines are of the older schema_version {self.older_schema}: "
                       "exported as they are (fields they lack are absent)")
        if self.left_out:
            out.append(f"{self.left_out} trajectory(ies) not written as ATIF: " + "; ".join(self.left_out_examples)
                       + ("; ..." if self.left_out > len(self.left_out_examples) else ""))
        return out


def default_out(source: Source, fmt: ExportFormat) -> Path:
    """Next to the JSON lines file, named after it (`trajectories.parquet`, `trajectories.hf`, `trajectories.atif`)."""
    return source.path.with_suffix("." + fmt.value)


def export_run(options: ExportOptions) -> ExportReport:
    """Export the trajectories `options` names; see `ExportOptions`.

    Raises:
        ExportError: Bad input (no trajectories, a line that is not JSON, `out` exists), or nothing to write.
    """
    began = time.monotonic()
    source = find_source(options.path)
    out = Path(options.out) if options.out is not None else default_out(source, options.format)
    if source.path.resolve().is_relative_to(out.resolve()):  # replacing it would remove what is being exported
        raise ExportError(f"{out} is or holds {source.path.name}, the file being exported: pick another --out")
    if out.exists() and not options.overwrite:
        raise ExportError(f"{out} exists: pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    stats = ReadStats()
    staging = _make_staging(out)
    try:
        staged = staging / out.name
        with _Progress(options.progress, source, stats) as progress:
            lines = progress.track(read_lines(source, stats))
            left_out, examples = 0, []
            if options.format is ExportFormat.ATIF:
                written, left_out, examples = _write_atif(lines, staged, source, options.model_name)
            elif options.format is ExportFormat.PARQUET:
                from raygrpo.export.tables import write_parquet

                written = write_parquet(lines, staged, source.training, source.path.name)
            else:
                from raygrpo.export.tables import write_hf_dataset

                written = write_hf_dataset(lines, staged, source.training, source.path.name, source.path)
        if out.exists() or out.is_symlink():
            _remove(out)
        os.replace(staged, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report = ExportReport(source=source.path, format=options.format, out=out, lines=stats.lines, written=written,
                          seconds=time.monotonic() - began, truncation_note=stats.truncation_note(source),
                          older_schema=stats.older_schema, left_out=left_out, left_out_examples=examples)
    logger.info("exported %d trajectories of %s to %s in %.1f s", written, source.path, out, report.seconds)
    return report


def _make_staging(out: Path) -> Path:
    """The hidden folder next to `out` that the export is written in before it is renamed into place:
    `.<out name>.export-<host>-<pid>-<random>`.

    An export killed outright (SIGKILL, the OOM killer) cannot remove its folder, so each export first removes the
    folders of its own output name left by exports that are gone: made on this host by a pid that no longer runs.
    A live export's folder, this process's own, and folders of other hosts (a shared file system) are kept; a
    reused pid only keeps a dead export's folder until a later export.
    """
    host = _HOST_UNSAFE.sub("_", socket.gethostname()) or "host"
    pattern = re.compile(rf"\.{re.escape(out.name)}\.export-(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-[a-z0-9_]{{8}}")
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(out.parent):
            match = pattern.fullmatch(entry.name)
            if match is None or match["host"] != host or _alive(int(match["pid"])):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
    if removed:
        logger.warning("removed %d staging folder(s) of killed exports of %s: %s", len(removed), out,
                       ", ".join(removed))
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.export-{host}-{os.getpid()}-", dir=out.parent))


_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # an export in another thread of this process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except (OverflowError, ValueError):
        return False  # a pid no process can have
    return True


def _write_atif(lines: Iterator[Line], folder: Path, source: Source,
                model_name: str | None) -> tuple[int, int, list[str]]:
    """One ATIF file per trajectory in `folder`; returns (written, left out, why for the first few)."""
    from raygrpo.export.atif import NotMappable, rollout_id, to_atif, to_json

    version = _raygrpo_version()
    folder.mkdir()
    written = left_out = 0
    examples: list[str] = []
    for line in lines:
        name = rollout_id(line.record)
        if (folder / f"{name}.json").exists():  # the same rollout twice in one file: keep both
            name = f"{name}-line{line.number}"
        try:
            trajectory = to_atif(line.record, name=name, agent_version=version, model_name=model_name,
                                 origin=f"{source.path.name}:{line.number}")
        except NotMappable as exc:
            left_out += 1
            if len(examples) < LEFT_OUT_EXAMPLES:
                examples.append(f"line {line.number}: {exc}")
            continue
        except ValidationError as exc:  # a value of the line Harbor's model refuses (a token id of 2.5)
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"])
            raise ExportError(f"{source.path.name}: line {line.number}: Harbor's ATIF model refuses {where}: "
                              f"{problem['msg']}") from None
        (folder / f"{name}.json").write_text(to_json(trajectory), encoding="utf-8")
        written += 1
    if not written:
        raise ExportError(f"{source.path}: no trajectory maps to ATIF (" + "; ".join(examples) + ")")
    return written, left_out, examples


def _raygrpo_version() -> str:
    try:
        return importlib.metadata.version("raygrpo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


class _Progress:
    """A progress bar on stderr over the bytes of the JSON lines file read (nothing when off)."""

    def __init__(self, enabled: bool, source: Source, stats: ReadStats) -> None:
        self.enabled = enabled
        self.source = source
        self.stats = stats
        self._progress = None
        self._task = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                      TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(f"exporting {self.source.path.name}", total=self.source.size)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def track(self, lines: Iterator[Line]) -> Iterator[Line]:
        for count, line in enumerate(lines, start=1):
            if self._progress is not None and count % 256 == 0:
                self._progress.update(self._task, completed=self.stats.bytes_read)
            yield line
        if self._progress is not None:
            self._progress.update(self._task, completed=self.stats.bytes_read)
