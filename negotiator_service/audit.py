"""The audit trail: every decision the negotiator makes, to live watchers and a JSON-lines file.

`record_json` is the one JSON form of a record (pure). `AuditLog` is the
shell: `emit` appends the record to the file (one object per line, flushed,
so a crash loses nothing already decided) and offers it to every
subscription. Emitting never waits: each subscription has a bounded buffer,
and a watcher that lets it fill is dropped (its stream ends with
AuditWatcherDropped) instead of slowing any call down. The file is the
complete record; the stream is best effort per watcher.

A subscription sees the records emitted after `subscribe` returned, in emit
order; there is no replay.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from pathlib import Path
from typing import TextIO

from agentsidecar.negotiator_service.errors import AuditWatcherDropped
from agentsidecar.negotiator_service.model import AuditRecord, JsonValue, ToolCallRecord, Usage, Verdict

DEFAULT_WATCH_QUEUE_SIZE = 1000
_LOGGER = logging.getLogger("agentsidecar.negotiator_service.audit")


def verdict_json(verdict: Verdict) -> dict[str, JsonValue]:
    """A verdict as the CLI prints one: the requirement's fields beside its state."""
    requirement = verdict.requirement
    in_set = requirement.typed_set is not None
    return {
        "capability": requirement.capability.value,
        "set": requirement.typed_set.value if requirement.typed_set is not None else None,
        "member": requirement.member if in_set else None,
        "request_field": requirement.request_field,
        "state": verdict.state.value,
        "allowed_unknown": verdict.allowed_unknown,
    }


def record_json(record: AuditRecord) -> dict[str, JsonValue]:
    """The JSON object of one audit log line; field names are the AuditRecord proto's."""
    line: dict[str, JsonValue] = {
        "time": record.time.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "caller": record.caller,
        "operation": record.operation,
        "adapter": record.adapter,
        "declaration_version": record.declaration_version,
        "verdicts": [verdict_json(v) for v in record.verdicts],
        "outcome": record.outcome.value,
        "error_reason": record.error_reason,
        "allowed_unknown": [c.value for c in record.allowed_unknown],
        "conversation_id": record.conversation_id,
        "delegation_depth": record.delegation_depth,
        "seed": record.seed,
    }
    if record.usage is not None:  # as in the proto: absent when the upstream reported none
        line["usage"] = usage_json(record.usage)
    if record.tool_calls:
        line["tool_calls"] = [tool_call_json(call) for call in record.tool_calls]
    return line


def tool_call_json(record: ToolCallRecord) -> dict[str, JsonValue]:
    """One tool call as the audit log line holds it (`duration` in seconds)."""
    return {
        "function": record.function,
        "server": record.server,
        "tool": record.tool,
        "risk": record.risk.value if record.risk is not None else "",
        "decision": record.decision.value,
        "approval": record.approval.value,
        "duration": round(record.duration_seconds, 6),
        "error": record.error,
    }


def usage_json(usage: Usage) -> dict[str, JsonValue]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "cached_tokens": usage.cached_tokens,
    }


class AuditSubscription:
    """One watcher's buffer. Iterate it; it ends when the log closes."""

    def __init__(self, log: AuditLog, queue_size: int) -> None:
        self._log = log
        self._queue_size = queue_size
        self._pending: collections.deque[AuditRecord] = collections.deque()
        self._wake = asyncio.Event()
        self.dropped = False
        self.closed = False

    def offer(self, record: AuditRecord) -> bool:
        """Buffer a record without waiting; False (and dropped) when the buffer is full."""
        if self.dropped or self.closed:
            return False
        if len(self._pending) >= self._queue_size:
            self.dropped = True
        else:
            self._pending.append(record)
        self._wake.set()
        return not self.dropped

    async def next(self) -> AuditRecord:
        """The next record. Records buffered before a drop are delivered first.

        Raises AuditWatcherDropped once this watcher fell behind, and
        StopAsyncIteration when the log closed.
        """
        while True:
            if self._pending:
                return self._pending.popleft()
            if self.dropped:
                raise AuditWatcherDropped(self._queue_size)
            if self.closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()

    def end(self) -> None:
        self.closed = True
        self._wake.set()

    def close(self) -> None:
        """Stop watching."""
        self.end()
        self._log.unsubscribe(self)

    def __aiter__(self) -> AuditSubscription:
        return self

    async def __anext__(self) -> AuditRecord:
        return await self.next()


class AuditLog:
    def __init__(
        self,
        path: Path | None = None,
        *,
        queue_size: int = DEFAULT_WATCH_QUEUE_SIZE,
        logger: logging.Logger | None = None,
    ) -> None:
        """Open `path` for appending (None: the stream only).

        Raises ValueError naming the path when it cannot be opened, so a bad
        `--audit-log` stops start-up instead of losing the trail.
        """
        if queue_size < 1:
            raise ValueError(f"the audit watch queue size must be at least 1, not {queue_size}")
        self.path = path
        self._queue_size = queue_size
        self._logger = logger or _LOGGER
        self._subscriptions: set[AuditSubscription] = set()
        self._file: TextIO | None = None
        if path is not None:
            try:
                self._file = path.open("a", encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"cannot open the audit log {path}: {exc.strerror or exc}") from exc

    @property
    def watcher_count(self) -> int:
        return len(self._subscriptions)

    @property
    def listening(self) -> bool:
        """Whether an emitted record goes anywhere (a file or a watcher); if not, emitters may skip it."""
        return self._file is not None or bool(self._subscriptions)

    def emit(self, record: AuditRecord) -> None:
        """Write the record to the file and offer it to every watcher; never waits on a watcher."""
        if self._file is not None:
            line = json.dumps(record_json(record), ensure_ascii=False, separators=(",", ":"))
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError):
                # The call already happened: failing it now would not undo it. Say so loudly.
                self._logger.exception("cannot append to the audit log %s; record: %s", self.path, line)
        for subscription in list(self._subscriptions):
            if not subscription.offer(record):
                self._subscriptions.discard(subscription)
                self._logger.warning("dropped an audit watcher that fell %d records behind", self._queue_size)

    def subscribe(self) -> AuditSubscription:
        subscription = AuditSubscription(self, self._queue_size)
        self._subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: AuditSubscription) -> None:
        self._subscriptions.discard(subscription)

    def close(self) -> None:
        """End every subscription and close the file. Idempotent."""
        for subscription in list(self._subscriptions):
            subscription.end()
        self._subscriptions.clear()
        if self._file is not None:
            self._file.close()
            self._file = None
