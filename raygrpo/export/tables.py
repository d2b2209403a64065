"""Writing trajectories as Parquet, or as a Hugging Face dataset folder, a row group at a time.

The lines are encoded into Arrow record batches of at most `BATCH_ROWS` trajectories or `BATCH_BYTES` of JSON
lines (`record_batches`), and each batch is written as soon as it is built: Parquet through
`pyarrow.parquet.ParquetWriter` (one row group per batch), the Hugging Face dataset through `datasets`' own
`ArrowWriter` (the writer `Dataset.save_to_disk` uses, shards of at most `datasets.config.MAX_SHARD_SIZE`), with the
`state.json` and `dataset_info.json` that `datasets.load_from_disk` reads. So memory is bounded by one batch however
long the run.

Why not `Dataset.from_parquet(...).save_to_disk(...)`: measured on 100,000 trajectories, its peak RSS grew with the
run (679 MiB against 321 MiB for 10,000): pyarrow's batch reader of this nested schema keeps what it read unless
`pre_buffer` is off, and `save_to_disk` reads the whole memory-mapped Arrow cache back, so its pages add up in RSS.
The Parquet file reads back with `datasets.load_dataset("parquet", data_files=...)` too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from raygrpo.export.lines import ExportError, Line
from raygrpo.export.schema import EXTRA, SCHEMA_VERSION, arrow_schema, decode_row, trajectory_codec

#: Trajectories per row group (and per Arrow batch built in memory).
BATCH_ROWS = 1024
#: A row group is written early once its JSON lines reach this many bytes (long trajectories).
BATCH_BYTES = 64 * 1024 * 1024
#: Columns of JSON text (besides every struct's `_extra`), recorded in the file's metadata.
JSON_COLUMNS = ("task.metadata", "messages.tool_calls.function.arguments", "steps.metadata", "verifier.rewards")


def file_metadata(source_name: str, training: bool) -> dict[str, str]:
    """Key-value metadata of an exported file: where it came from and which columns hold JSON text."""
    return {
        "raygrpo.source": source_name,
        "raygrpo.kind": "training" if training else "rollout",
        "raygrpo.schema_version": str(SCHEMA_VERSION),
        "raygrpo.json_columns": ",".join([*JSON_COLUMNS, f"*.{EXTRA}"]),
    }


def record_batches(lines: Iterable[Line], schema: pa.Schema, training: bool,
                   source_name: str) -> Iterator[pa.RecordBatch]:
    """`lines` encoded into record batches of `schema`, one at a time.

    Raises:
        ExportError: A token id or mask value that is not an integer (2.5), naming its line and field; a value
            pyarrow cannot store in its column (a token id past int32), naming the lines of its batch.
    """
    codec = trajectory_codec(training)
    rows: list[dict[str, Any]] = []
    numbers: list[int] = []
    size = 0

    def build() -> pa.RecordBatch:
        try:
            return pa.RecordBatch.from_pylist(rows, schema=schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise ExportError(f"{source_name}: lines {numbers[0]}-{numbers[-1]}: a value does not fit its "
                              f"column: {exc}") from None

    for line in lines:
        try:
            rows.append(codec.encode(line.record))
        except ValueError as exc:
            raise ExportError(f"{source_name}: line {line.number}: {exc}") from None
        numbers.append(line.number)
        size += line.size
        if len(rows) >= BATCH_ROWS or size >= BATCH_BYTES:
            yield build()
            rows.clear()
            numbers.clear()
            size = 0
    if rows:
        yield build()


def write_parquet(lines: Iterable[Line], out: Path, training: bool, source_name: str) -> int:
    """Write `lines` to the Parquet file `out`, one row per trajectory and a row group per batch; returns the rows.

    Args:
        lines: The trajectories, in file order.
        out: The Parquet file to write.
        training: Lines of a training run (a `step` column first).
        source_name: The JSON lines file's name, kept in the file's metadata.
    """
    schema = arrow_schema(training, file_metadata(source_name, training))
    written = 0
    with pq.ParquetWriter(out, schema, compression="zstd") as writer:
        for batch in record_batches(lines, schema, training, source_name):
            writer.write_batch(batch)
            written += batch.num_rows
    return written


def write_hf_dataset(lines: Iterable[Line], out: Path, training: bool, source_name: str,
                     fingerprint_of: Path | None = None) -> int:
    """Write `lines` as a Hugging Face dataset folder `out` (`datasets.load_from_disk`); returns its rows.

    The folder is what `Dataset.save_to_disk` writes: Arrow shards `data-NNNNN-of-NNNNN.arrow` written by
    `datasets.arrow_writer.ArrowWriter`, `dataset_info.json` (`DatasetInfo.write_to_directory`, the features and, in
    its description, where the rows came from) and `state.json`.

    Args:
        lines: The trajectories, in file order.
        out: The folder to create.
        training: Lines of a training run (a `step` column first).
        source_name: The JSON lines file's name.
        fingerprint_of: The source file: the dataset's fingerprint derives from its path, size and time.
    """
    import datasets
    from datasets.arrow_writer import ArrowWriter
    from datasets.utils.py_utils import convert_file_size_to_int

    metadata = file_metadata(source_name, training)
    schema = arrow_schema(training)
    features = datasets.Features.from_arrow_schema(schema)
    max_shard = convert_file_size_to_int(datasets.config.MAX_SHARD_SIZE)
    out.mkdir()
    shards: list[Path] = []
    writer: ArrowWriter | None = None
    shard_bytes = written = 0
    try:
        for batch in record_batches(lines, schema, training, source_name):
            if writer is None or shard_bytes >= max_shard:
                if writer is not None:
                    writer.finalize()
                    writer.close()
                shards.append(out / f"shard-{len(shards)}.arrow")
                writer = ArrowWriter(features=features, path=str(shards[-1]))
                shard_bytes = 0
            writer.write_table(pa.Table.from_batches([batch]))
            shard_bytes += batch.nbytes
            written += batch.num_rows
    finally:
        if writer is not None:
            writer.finalize()
            writer.close()
    names = [f"data-{i:05d}-of-{len(shards):05d}.arrow" for i in range(len(shards))]
    for shard, name in zip(shards, names):
        shard.rename(out / name)
    description = (f"raygrpo trajectories exported from {source_name}, one row per trajectory; raygrpo's "
                   f"metadata: {json.dumps(metadata)}")
    datasets.DatasetInfo(description=description, features=features).write_to_directory(str(out))
    state = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": _fingerprint(fingerprint_of, written),
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (out / datasets.config.DATASET_STATE_JSON_FILENAME).write_text(json.dumps(state, indent=2, sort_keys=True))
    return written


def _fingerprint(source: Path | None, rows: int) -> str:
    stat = source.stat() if source is not None else None
    key = f"raygrpo-export:{os.fspath(source) if source else ''}:{stat and stat.st_size}:{stat and stat.st_mtime_ns}"
    return hashlib.sha256(f"{key}:{rows}".encode()).hexdigest()[:16]


def read_parquet(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The trajectory lines of an exported Parquet file, as the JSON lines had them, a row group at a time.

    `pre_buffer` is off: with it, pyarrow's batch reader keeps what it read of these nested columns (measured: memory
    grew with the file).
    """
    for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches():
        for row in batch.to_pylist():
            yield decode_row(row)
