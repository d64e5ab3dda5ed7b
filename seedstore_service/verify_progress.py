"""How `seedstore verify` shows its VerifySeeds events while checks run.

* `JsonLines`: every event as one line of proto3 JSON (the VerifySeedsResponse
  message, field names as in the .proto), for programs.
* `LiveDisplay`: a rich progress display on a terminal: seeds done out of the
  total, each running seed's check j of m and its current check, elapsed time;
  one line per verdict stays on the screen once the display closes.

rich is imported here only, and this module only when a terminal display is wanted,
so the other commands do not pay for importing it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import TextIO

from google.protobuf import json_format
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agentsidecar.seedstore_service import convert
from agentsidecar.seedstore_service.model import VerificationStatus
from agentsidecar.seedstore_service.operations import SeedVerified, VerifyProgress
from agentsidecar.seedstore_service.runner import CheckFinished, CheckStarted

__all__ = ["JsonLines", "LiveDisplay", "event_json"]

SeedKey = tuple[str, str]  # (domain, id)


def event_json(seed_store: str, event: VerifyProgress) -> str:
    """One VerifySeedsResponse as a compact JSON line (no trailing newline)."""
    message = convert.verify_event_to_proto(seed_store, event)
    as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return json.dumps(as_dict, ensure_ascii=False, separators=(",", ":"))


class JsonLines:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, seed_store: str, event: VerifyProgress) -> None:
        self._stream.write(event_json(seed_store, event) + "\n")
        self._stream.flush()


class LiveDisplay:
    """A context manager; call it with each event. `checks` is each seed's planned check count, if known."""

    def __init__(self, stream: TextIO, checks: Mapping[SeedKey, int] | None) -> None:
        self._checks = dict(checks or {})
        self._console = Console(file=stream, highlight=False)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[current]}"),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
        )
        total = len(self._checks) if checks is not None else None
        self._overall: TaskID = self._progress.add_task("seeds", total=total, current="")
        self._seeds: dict[SeedKey, TaskID] = {}

    def __enter__(self) -> LiveDisplay:
        self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._progress.stop()

    def _seed_task(self, key: SeedKey) -> TaskID:
        task = self._seeds.get(key)
        if task is None:
            domain, seed_id = key
            task = self._progress.add_task(f"  {domain}/{seed_id}", total=self._checks.get(key), current="")
            self._seeds[key] = task
        return task

    def __call__(self, seed_store: str, event: VerifyProgress) -> None:
        if isinstance(event, CheckStarted):
            task = self._seed_task((event.domain, event.seed_id))
            self._progress.update(task, current=event.check)
        elif isinstance(event, CheckFinished):
            task = self._seed_task((event.domain, event.seed_id))
            self._progress.update(task, completed=event.index + 1, current=event.check)
        elif isinstance(event, SeedVerified):
            key = (event.domain, event.id)
            if key in self._seeds:
                self._progress.remove_task(self._seeds.pop(key))
            self._progress.advance(self._overall)
            mark = "ok" if event.status is VerificationStatus.VERIFIED else "FAILED"
            passed = sum(outcome.ok for outcome in event.outcomes)
            self._progress.console.print(
                f"{mark:6} {event.domain}/{event.id}: {event.status.value} "
                f"({passed} of {len(event.outcomes)} checks passed)",
                markup=False,
            )
        # Every event is drawn, however short the check: events are few and far between.
        self._progress.refresh()
