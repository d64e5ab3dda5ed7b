"""Runtime registrations (RegisterAdapter) kept in the state directory, so a restart re-establishes them.

One file, `registrations.json` beside the conversations, holding every
runtime-registered remote adapter: its shortname, its target and the last
GetDeclaration reply it sent (so a remote that is down when the negotiator
starts is still listed, NOT_SERVING, with the declaration it last made).

    {"format": 1, "registrations": [{"shortname": ..., "target": ...,
                                     "declaration_response": {GetDeclarationResponse as proto JSON}}]}

Every change is written before it takes effect, atomically (temp file,
fsync, rename, fsync of the directory): a RegisterAdapter or
DeregisterAdapter whose write fails changes nothing and fails with
RegistrationStoreFailed. A re-read declaration of a new version is written
too. Writes are serialized, each holding the registry as it is then, so the
file never goes back to an older set.

At start-up a file that cannot be read (not JSON, not this format, another
format version) is reported and moved aside to `registrations.json.corrupt`
(the operator decides what to do with it); the negotiator starts with the
config's adapters and no runtime registrations. A single entry that is
malformed, names a target the operator no longer allows, or whose shortname
a config adapter now takes, is reported and skipped, and left out of the
file at its next write. An entry whose remote does not answer is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format

from agentsidecar.adapter.v1 import adapter_pb2
from agentsidecar.negotiator_service.errors import (
    AdapterAlreadyExists,
    AdapterNotRemovable,
    NegotiatorError,
    RegistrationStoreFailed,
)
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter

FILE_NAME = "registrations.json"
CORRUPT_SUFFIX = ".corrupt"
FORMAT = 1
_LOGGER = logging.getLogger("agentsidecar.negotiator_service.registrations")


# --- the pure core ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRegistration:
    shortname: str
    target: str
    declaration_response: adapter_pb2.GetDeclarationResponse


def registrations_to_text(registrations: Sequence[StoredRegistration]) -> str:
    entries = [
        {
            "shortname": registration.shortname,
            "target": registration.target,
            "declaration_response": json_format.MessageToDict(registration.declaration_response),
        }
        for registration in registrations
    ]
    return json.dumps({"format": FORMAT, "registrations": entries}, ensure_ascii=False, indent=1) + "\n"


def registrations_from_text(text: str) -> tuple[list[StoredRegistration], list[str]]:
    """The registrations of a file, and a problem per entry skipped; ValueError when the file is unusable."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("format") != FORMAT:
        raise ValueError(f"format is {data.get('format')!r}, this negotiator reads format {FORMAT}")
    entries = data.get("registrations")
    if not isinstance(entries, list):
        raise ValueError("registrations is not a list")
    registrations: list[StoredRegistration] = []
    problems: list[str] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        try:
            registration = _registration(entry)
        except ValueError as exc:
            problems.append(f"registrations[{index}]: {exc}")
            continue
        if registration.shortname in seen:
            problems.append(f'registrations[{index}]: "{registration.shortname}" is registered twice')
            continue
        seen.add(registration.shortname)
        registrations.append(registration)
    return registrations, problems


def _registration(entry: object) -> StoredRegistration:
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    for name in ("shortname", "target"):
        if not isinstance(entry.get(name), str) or not entry[name]:
            raise ValueError(f"{name} is not a non-empty string")
    raw = entry.get("declaration_response")
    if not isinstance(raw, dict):
        raise ValueError("declaration_response is not a JSON object")
    response = adapter_pb2.GetDeclarationResponse()
    try:
        json_format.ParseDict(raw, response)
    except json_format.ParseError as exc:
        raise ValueError(f"declaration_response is not a GetDeclarationResponse: {exc}") from exc
    return StoredRegistration(entry["shortname"], entry["target"], response)


# --- the shell: the file ---------------------------------------------------------


class RegistrationStore:
    """The registrations file in `directory` (created 0700 on the first write). Blocking I/O."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME

    def load(self) -> tuple[list[StoredRegistration], list[str]]:
        """The stored registrations and every problem met; an unreadable file is moved aside."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            # Left where it is: an unreadable file is no proof of a corrupt one.
            return [], [f"cannot read {self.path}: {exc.strerror or exc}; no runtime registration restored"]
        except UnicodeDecodeError as exc:
            return [], [self._set_aside(f"not UTF-8 text ({exc.reason})")]
        try:
            return registrations_from_text(text)
        except ValueError as exc:
            return [], [self._set_aside(str(exc))]

    def save(self, text: str) -> None:
        """Replace the file atomically: a reader sees the old or the new, never half. OSError on failure."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(dir=self.directory, prefix=".registrations-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as temp:
                temp.write(text)
                temp.flush()
                os.fsync(temp.fileno())
            os.replace(temp_name, self.path)
            temp_name = ""
            # The rename is durable only once the directory entry is.
            directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory_fd)
            finally:
                os.close(directory_fd)
        finally:
            if temp_name:
                with contextlib.suppress(OSError):
                    os.unlink(temp_name)

    def _set_aside(self, problem: str) -> str:
        aside = self.path.with_name(self.path.name + CORRUPT_SUFFIX)
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            return f"{self.path} is unusable ({problem}) and cannot be moved aside ({exc.strerror or exc})"
        return f"{self.path} is unusable ({problem}); moved to {aside}, no runtime registration restored"


# --- runtime registrations: the registry and the file together ------------------------------


Restore = Callable[[StoredRegistration], Awaitable[RegisteredAdapter]]


class RuntimeRegistrations:
    """Adds and removes runtime adapters in `registry`, keeping `store` (None: memory only) in step."""

    def __init__(self, registry: AdapterRegistry, store: RegistrationStore | None = None) -> None:
        self._registry = registry
        self._store = store
        self._lock = asyncio.Lock()
        self._written = ""  # the text last written, so an unchanged set is not written again
        self._pending: set[asyncio.Task[None]] = set()
        if store is not None:
            registry.listen(self._changed)

    async def register(self, entry: RegisteredAdapter) -> None:
        """Add a runtime adapter, once the file holds it (AdapterAlreadyExists, RegistrationStoreFailed)."""
        async with self._lock:
            if self._registry.find_declaration(entry.shortname) is not None:
                raise AdapterAlreadyExists(entry.shortname)
            await self._write(entry.shortname, [*self._runtime(), entry])
            self._registry.add(entry)

    async def deregister(self, shortname: str) -> RegisteredAdapter:
        """Remove a runtime adapter, once the file no longer holds it; the caller closes it."""
        async with self._lock:
            entry = self._registry.get(shortname)
            if entry.source == "config":
                raise AdapterNotRemovable(shortname)
            await self._write(shortname, [e for e in self._runtime() if e.shortname != shortname])
            return self._registry.remove(shortname)

    async def restore(self, restore: Restore) -> list[str]:
        """Re-establish every stored registration; the problems met (each also logged).

        A stored entry whose remote does not answer is kept, NOT_SERVING.
        """
        problems: list[str] = []
        if self._store is not None:
            stored, problems = await asyncio.to_thread(self._store.load)
            results = await asyncio.gather(*(restore(s) for s in stored), return_exceptions=True)
            for registration, result in zip(stored, results, strict=True):
                if isinstance(result, NegotiatorError):
                    problems.append(f'registration "{registration.shortname}" skipped: {result.message}')
                elif isinstance(result, BaseException):
                    raise result
                elif self._registry.find_declaration(registration.shortname) is not None:
                    await result.adapter.close()
                    problems.append(
                        f'registration "{registration.shortname}" skipped: a config adapter took its name'
                    )
                else:
                    self._registry.add(result)
                    _LOGGER.info(
                        "restored runtime adapter %s at %s%s",
                        result.shortname,
                        result.target,
                        f" (not serving: {result.serving_detail})" if result.serving_detail else "",
                    )
        for problem in problems:
            _LOGGER.error("runtime registrations: %s", problem)
        return problems

    async def close(self) -> None:
        """Finish the writes under way."""
        await asyncio.gather(*self._pending, return_exceptions=True)

    def _changed(self, change: str, entry: RegisteredAdapter) -> None:
        if change == "updated" and entry.source == "runtime":
            task = asyncio.create_task(self._rewrite(entry.shortname), name="runtime registrations")
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _rewrite(self, shortname: str) -> None:
        """Write the file again: a runtime adapter may have re-read a declaration of a new version."""
        async with self._lock:
            try:
                await self._write(shortname, self._runtime())
            except RegistrationStoreFailed as exc:  # the next change tries again
                _LOGGER.error("runtime registrations: %s", exc.message)

    def _runtime(self) -> list[RegisteredAdapter]:
        return [entry for entry in self._registry.list() if entry.source == "runtime"]

    async def _write(self, shortname: str, entries: Sequence[RegisteredAdapter]) -> None:
        if self._store is None:
            return
        text = registrations_to_text([s for s in map(stored, entries) if s is not None])
        if text == self._written:
            return
        try:
            await asyncio.to_thread(self._store.save, text)
            self._written = text
        except OSError as exc:
            raise RegistrationStoreFailed(
                shortname, f"cannot write {exc.filename or self._store.path}: {exc.strerror or exc}"
            ) from exc


def stored(entry: RegisteredAdapter) -> StoredRegistration | None:
    """What the file keeps of a runtime adapter: a remote one's last GetDeclaration reply (else None)."""
    response = getattr(entry.adapter, "declaration_response", None)
    if not isinstance(response, adapter_pb2.GetDeclarationResponse) or not entry.target:
        return None  # only a remote adapter can be connected to again
    return StoredRegistration(entry.shortname, entry.target, response)
