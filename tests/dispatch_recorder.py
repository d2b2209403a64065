"""Actor handles that record the calls the orchestrator makes on them, for testing dispatch and hinting without Ray."""

from __future__ import annotations


class _Method:
    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def remote(self, *args):
        self.calls.append((self.name, args))
        return object()  # stands for the call's ObjectRef


class RecordingActor:
    """Records `run_many` and `prewarm` calls (the only ones dispatch and hinting make)."""

    def __init__(self) -> None:
        self.calls: list = []
        self.run_many = _Method("run_many", self.calls)
        self.prewarm = _Method("prewarm", self.calls)

    def told(self) -> list[int]:
        return [t.index for name, args in self.calls if name == "prewarm" for t in args[0]]

    def batches(self) -> list[list]:
        """The `RolloutCall`s of each `run_many` call, in order."""
        return [list(args[0]) for name, args in self.calls if name == "run_many"]

    def ran(self) -> list[int]:
        return [call.task.index for batch in self.batches() for call in batch]
