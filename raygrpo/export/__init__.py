"""`raygrpo export`: a run's trajectories in the formats people already use.

- `lines`: finding a run's `trajectories.jsonl` / `rollouts.jsonl` and reading it a line at a time (a cut-off last
  line, from a killed run, is left out and reported).
- `schema`: the Arrow schema of a trajectory line and the codec both ways (`decode_row` turns an exported row back
  into its JSON line).
- `tables`: Parquet written a row group at a time, and the Hugging Face dataset made from it.
- `atif`: a trajectory as Harbor's ATIF, built with Harbor's models.
- `run`: the command's work (`export_run`), writing under a temporary name and renaming into place.
"""

from raygrpo.export.lines import ExportError
from raygrpo.export.run import ExportFormat, ExportOptions, ExportReport, export_run
from raygrpo.export.schema import decode_row

__all__ = ["ExportError", "ExportFormat", "ExportOptions", "ExportReport", "decode_row", "export_run"]
