"""The adapters the negotiator knows, and a feed of changes to them.

Single event loop, no locks: `add` and `remove` never await, so a watcher's
snapshot of existing adapters and its subscription happen atomically and it
can neither miss nor double-count a change.

An adapter that checks its remote (a `Monitored` one: the remote adapter)
is set monitoring when added; each change it reports (a new declaration
version, a serving-status change) is published as "updated" while it is
still the adapter registered under its shortname.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from agentsidecar.negotiator_service.errors import AdapterAlreadyExists, AdapterNotFound, AdapterNotRemovable
from agentsidecar.negotiator_service.model import Adapter, Declaration

Change = Literal["existing", "registered", "deregistered", "updated"]
# How often a monitored adapter checks its remote, unless the registry is told otherwise.
DEFAULT_REFRESH_SECONDS = 30.0


@runtime_checkable
class Monitored(Protocol):
    """An adapter whose declaration and serving status can change while it is registered."""

    @property
    def serving(self) -> bool: ...

    @property
    def serving_detail(self) -> str: ...

    def monitor(self, refresh_seconds: float, changed: Callable[[], None]) -> None: ...


@dataclass(frozen=True)
class RegisteredAdapter:
    adapter: Adapter
    source: str  # "config" | "runtime"
    target: str = ""  # address of a remote adapter

    @property
    def shortname(self) -> str:
        return self.adapter.declaration.shortname

    @property
    def serving_detail(self) -> str:
        """Why calls cannot reach the adapter now; "" while they can (always, for a local adapter)."""
        return self.adapter.serving_detail if isinstance(self.adapter, Monitored) else ""


class AdapterRegistry:
    def __init__(self, refresh_seconds: float = DEFAULT_REFRESH_SECONDS) -> None:
        self.refresh_seconds = refresh_seconds
        self._entries: dict[str, RegisteredAdapter] = {}
        self._watchers: set[asyncio.Queue[tuple[Change, RegisteredAdapter] | None]] = set()
        self._listeners: list[Callable[[Change, RegisteredAdapter], None]] = []
        self._closed = False

    def listen(self, listener: Callable[[Change, RegisteredAdapter], None]) -> None:
        """Call `listener` with every change as it is published (inside add/remove: it must not block)."""
        self._listeners.append(listener)

    def add(self, entry: RegisteredAdapter) -> None:
        shortname = entry.shortname
        if shortname in self._entries:
            raise AdapterAlreadyExists(shortname)
        self._entries[shortname] = entry
        self._publish("registered", entry)
        if isinstance(entry.adapter, Monitored):
            entry.adapter.monitor(self.refresh_seconds, lambda: self._updated(entry))

    def remove(self, shortname: str) -> RegisteredAdapter:
        """Remove a runtime adapter and return it; the caller closes it."""
        entry = self.get(shortname)
        if entry.source == "config":
            raise AdapterNotRemovable(shortname)
        del self._entries[shortname]
        self._publish("deregistered", entry)
        return entry

    def get(self, shortname: str) -> RegisteredAdapter:
        try:
            return self._entries[shortname]
        except KeyError:
            raise AdapterNotFound(shortname) from None

    def declaration(self, shortname: str) -> Declaration:
        return self.get(shortname).adapter.declaration

    def find_declaration(self, shortname: str) -> Declaration | None:
        """The declaration of `shortname`, or None when no such adapter is registered."""
        entry = self._entries.get(shortname)
        return entry.adapter.declaration if entry is not None else None

    def list(self) -> list[RegisteredAdapter]:
        return [self._entries[name] for name in sorted(self._entries)]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    async def watch(self) -> AsyncGenerator[tuple[Change, RegisteredAdapter], None]:
        """("existing", e) for each current adapter, then every change as it happens.

        Ends when the registry closes. The watcher subscribes when it first
        asks for an item; one that stops iterating is unsubscribed when the
        generator is closed (explicitly, or when it is garbage-collected).
        """
        queue: asyncio.Queue[tuple[Change, RegisteredAdapter] | None] = asyncio.Queue()
        # No await between the snapshot and the subscription: see the module docstring.
        existing = self.list()
        if self._closed:
            return
        self._watchers.add(queue)
        try:
            for entry in existing:
                yield "existing", entry
            while True:
                item = await queue.get()
                if item is None:  # the registry closed
                    return
                yield item
        finally:
            self._watchers.discard(queue)

    async def close(self) -> None:
        """End every watch and close every adapter (each once, errors not masking others)."""
        self._closed = True
        for queue in self._watchers:
            queue.put_nowait(None)
        entries, self._entries = list(self._entries.values()), {}
        failures: list[Exception] = []
        for entry in entries:
            try:
                await entry.adapter.close()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise ExceptionGroup("closing adapters failed", failures)

    def changed(self, shortname: str, entry: RegisteredAdapter) -> None:
        """Publish "updated" for `entry` (its evidence or declaration changed) while it is `shortname`'s."""
        if self._entries.get(shortname) is entry:
            self._publish("updated", entry)

    def _updated(self, entry: RegisteredAdapter) -> None:
        if self._entries.get(entry.shortname) is entry:
            self._publish("updated", entry)

    def _publish(self, change: Change, entry: RegisteredAdapter) -> None:
        for queue in self._watchers:
            queue.put_nowait((change, entry))
        for listener in self._listeners:
            listener(change, entry)
