"""Conversations: calls sharing a conversation id run one at a time, as whole transactions.

A conversation is created by its first successful call, which binds it to
that call's adapter and pins the adapter's declaration version. Every later
call of the conversation:

- waits until no other call of the same conversation is running (or, with
  `no_wait`, fails at once with ConversationBusy / ABORTED). The lease is held
  in process by an asyncio lock and across processes by an exclusive flock on
  a lock file beside the state, so two negotiators sharing a state directory
  still serialize;
- must name the same adapter (ConversationAdapterMismatch otherwise) whose
  declaration must still have the pinned version (DeclarationChanged
  otherwise). The state of one adapter means nothing to another, and a
  declaration that changed mid-conversation may not honour what the state
  assumes (docs/negotiation.md, "Declarations are the truth"). `new_conversation`
  drops the state, the binding and the pin, and starts afresh;
- gets the committed adapter state (`AdapterCall.conversation_state`) and
  returns the next one (`AdapterReply.conversation_state`), which is
  committed only after the whole call succeeded, output validation
  included. A failed or cancelled call commits nothing, so the next call sees
  the state before it. `new_conversation` too takes effect only on commit: a
  failed call that asked for it leaves the old conversation as it was.
  One window is unavoidable: a call cancelled while its commit is being
  written keeps the commit (the write finishes before the lease is released,
  so the next call sees it).

Delegation depth is kept per conversation and only grows: a call runs at
max(incoming depth, stored depth), and that depth is stored on commit. It
survives `new_conversation` too, because it limits delegation, not content.

A conversation id is a bearer secret: whoever knows it continues the
conversation and reads what its state holds. Callers choose unguessable ids,
or ask for one (`new_conversation_id`, CallOptions.generate_conversation_id).
Each conversation also has an owner: "" when the negotiator has no bearer
tokens, else a digest of the token the call carried (`owner_of`). The owner
is part of the conversation's key, so a caller with another token that
reuses an id starts a conversation of its own: it can neither read nor
disturb (lease, restart) the first, nor learn that it exists.

State lives on disk (the embedded default), one JSON file per conversation
named by the SHA-256 of its owner and id (so any id is a safe file name), written
atomically: temp file, fsync, rename, fsync of the directory. A negotiator
restarted on the same directory resumes every conversation.

Calls without a conversation id, and calls the declaration would refuse
anyway, pass straight through to the broker: a refusal never waits for a
busy conversation, and never touches the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from agentsidecar.negotiator_service.errors import (
    AdapterInternal,
    ConversationAdapterMismatch,
    ConversationBusy,
    ConversationStateCorrupt,
    ConversationStoreFailed,
    DeclarationChanged,
    NegotiatorError,
)
from agentsidecar.negotiator_service.model import AdapterReply, CallRequest, Decision, JsonValue
from agentsidecar.sidecar_runtime.proctree import to_the_end

STATE_SUBDIRECTORY = Path("agentsidecar") / "conversations"
# How often a call waiting for a conversation held by another process looks again.
DEFAULT_POLL_SECONDS = 0.02
_RECORD_FIELDS = (
    "conversation_id",
    "adapter",
    "declaration_version",
    "delegation_depth",
    "state",
    "turns",
    "updated_at",
)


def default_state_dir(environ: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """`$XDG_STATE_HOME/agentsidecar/conversations`, else `~/.local/state/agentsidecar/conversations`.

    A relative XDG_STATE_HOME is ignored, as the XDG base-directory spec says.
    """
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_STATE_HOME", "")
    if base and Path(base).is_absolute():
        return Path(base) / STATE_SUBDIRECTORY
    return (home if home is not None else Path.home()) / ".local" / "state" / STATE_SUBDIRECTORY


# Random bytes in a generated conversation id.
GENERATED_ID_BYTES = 24


def new_conversation_id() -> str:
    """A fresh, unguessable conversation id (URL-safe base64 of GENERATED_ID_BYTES random bytes)."""
    return secrets.token_urlsafe(GENERATED_ID_BYTES)


def owner_of(token: bytes | None) -> str:
    """The conversation owner for a call carrying bearer `token`; "" without one.

    A digest, so neither the state files nor their names hold the token.
    """
    if not token:
        return ""
    return "sha256:" + hashlib.sha256(token).hexdigest()


# --- the pure core ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """A conversation as committed: what its next call starts from."""

    conversation_id: str
    adapter: str
    declaration_version: str
    delegation_depth: int
    state: JsonValue  # the adapter's, opaque here
    turns: int  # committed calls since the conversation (re)started
    updated_at: str  # RFC 3339, UTC


@dataclass(frozen=True, slots=True)
class Turn:
    """What one call starts from; outside a conversation, `conversation_id` is None."""

    conversation_id: str | None
    state: JsonValue
    delegation_depth: int


def record_to_text(record: ConversationRecord) -> str:
    """The record's file content. Raises ValueError/TypeError when the state is not JSON."""
    values: dict[str, JsonValue] = {name: getattr(record, name) for name in _RECORD_FIELDS}
    return json.dumps(values, ensure_ascii=False, allow_nan=False, indent=1) + "\n"


def record_from_text(conversation_id: str, text: str) -> ConversationRecord:
    """Parse a record file; ValueError names what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    missing = [name for name in _RECORD_FIELDS if name not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    if data["conversation_id"] != conversation_id:
        raise ValueError(f"the file belongs to conversation {data['conversation_id']!r}")
    for name in ("adapter", "declaration_version", "updated_at"):
        if not isinstance(data[name], str) or not data[name]:
            raise ValueError(f"{name} is not a non-empty string")
    for name in ("delegation_depth", "turns"):
        value = data[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} is not a non-negative integer")
    return ConversationRecord(**{name: data[name] for name in _RECORD_FIELDS})


def check_binding(record: ConversationRecord, shortname: str, current_version: str) -> None:
    """Refuse a call that would continue `record` with another adapter or declaration."""
    if shortname != record.adapter:
        raise ConversationAdapterMismatch(record.conversation_id, record.adapter, shortname)
    if current_version != record.declaration_version:
        raise DeclarationChanged(
            record.conversation_id, shortname, record.declaration_version, current_version
        )


def start_turn(
    conversation_id: str, stored: ConversationRecord | None, *, restart: bool, incoming_depth: int
) -> Turn:
    """The turn a call starts from; `restart` (new_conversation) drops the state but not the depth."""
    stored_depth = stored.delegation_depth if stored is not None else 0
    state = None if restart or stored is None else stored.state
    return Turn(conversation_id, state, max(incoming_depth, stored_depth))


def next_record(
    previous: ConversationRecord | None, turn: Turn, decision: Decision, reply: AdapterReply, now: datetime
) -> ConversationRecord:
    """The record a successful call commits; `previous` is None when the conversation (re)starts."""
    assert turn.conversation_id is not None  # only conversation turns commit
    return ConversationRecord(
        conversation_id=turn.conversation_id,
        adapter=decision.adapter,
        declaration_version=decision.declaration_version,
        delegation_depth=turn.delegation_depth,
        state=reply.conversation_state,
        turns=(previous.turns if previous is not None else 0) + 1,
        updated_at=now.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )


# --- the shell: files and leases ----------------------------------------------------------


class ConversationStore:
    """One JSON file per conversation in `directory`, created (0700) on first use.

    Blocking I/O; the manager runs reads and writes in a worker thread.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, conversation_id: str, owner: str = "") -> Path:
        return self.directory / f"{_file_stem(conversation_id, owner)}.json"

    def load(self, conversation_id: str, owner: str = "") -> ConversationRecord | None:
        """The committed record, or None for a conversation never committed."""
        try:
            text = self.path(conversation_id, owner).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as exc:
            raise ConversationStateCorrupt(conversation_id, f"not UTF-8 text ({exc.reason})") from exc
        except OSError as exc:
            raise ConversationStoreFailed(
                conversation_id, f"cannot read {exc.filename}: {exc.strerror}"
            ) from exc
        try:
            return record_from_text(conversation_id, text)
        except ValueError as exc:
            raise ConversationStateCorrupt(conversation_id, str(exc)) from exc

    def save(self, conversation_id: str, text: str, owner: str = "") -> None:
        """Replace the conversation's file atomically: a reader sees the old or the new, never half."""
        target = self.path(conversation_id, owner)
        temp_name = ""
        try:
            self._ensure_directory()
            fd, temp_name = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as temp:
                temp.write(text)
                temp.flush()
                os.fsync(temp.fileno())
            os.replace(temp_name, target)
            temp_name = ""
            _fsync_directory(self.directory)
        except OSError as exc:
            raise ConversationStoreFailed(
                conversation_id, f"cannot write {exc.filename or target}: {exc.strerror or exc}"
            ) from exc
        finally:
            if temp_name:
                with contextlib.suppress(OSError):
                    os.unlink(temp_name)

    def try_lock(self, conversation_id: str, owner: str = "") -> int | None:
        """An exclusive flock on the conversation's lock file (its fd), or None if another process holds it.

        Lock files are never deleted: deleting one races with a process
        about to lock it. Non-blocking, so safe to call on the event loop.
        """
        path = self.directory / f"{_file_stem(conversation_id, owner)}.lock"
        try:
            self._ensure_directory()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConversationStoreFailed(
                conversation_id, f"cannot open {exc.filename or path}: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:
            os.close(fd)
            raise ConversationStoreFailed(conversation_id, f"cannot lock {path}: {exc.strerror}") from exc
        return fd

    @staticmethod
    def unlock(fd: int) -> None:
        os.close(fd)  # closing the descriptor releases its flock

    def _ensure_directory(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)


def _file_stem(conversation_id: str, owner: str = "") -> str:
    # Without an owner, the name the store has always used; with one, the
    # NUL keeps (owner, id) pairs from colliding (neither holds a NUL).
    key = f"{owner}\0{conversation_id}" if owner else conversation_id
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class _Slot:
    """The in-process lease of one conversation."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # the holder plus every waiter


Dispatch = Callable[[Turn], Awaitable[tuple[AdapterReply, Decision]]]
Preview = Callable[[CallRequest], Decision]
Refused = Callable[[NegotiatorError], None]


class ConversationManager:
    """Runs brokered calls as conversation transactions; see the module docstring."""

    def __init__(
        self,
        store: ConversationStore,
        preview: Preview,
        *,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`preview` is the broker's verdict on a call without running it (`Broker.preview`).

        It raises as the broker would (InvalidRequest, AdapterNotFound, ...).
        """
        self.store = store
        self._preview = preview
        self._poll_seconds = poll_seconds
        self._clock = clock
        self._slots: dict[tuple[str, str], _Slot] = {}

    async def run(
        self,
        request: CallRequest,
        delegation_depth: int,
        dispatch: Dispatch,
        *,
        refused: Refused | None = None,
        owner: str = "",
    ) -> tuple[AdapterReply, Decision]:
        """Run `dispatch` (the broker call) as a turn of the request's conversation, if it has one.

        `owner` (`owner_of` the caller's token) selects whose conversation of
        that id this is.

        `dispatch` must pass `turn.state` and `turn.delegation_depth` to the
        adapter call and compute anything time-dependent (the caller's
        remaining budget) only when called: it may run after a wait.
        `refused` hears every error raised here before `dispatch` ran (a busy
        conversation, a changed declaration...), which the broker never sees,
        so the caller can audit it.
        """
        conversation_id = request.options.conversation_id
        if conversation_id is None or not self._would_accept(request):
            # The broker refuses it (or runs it outside any conversation) as usual.
            return await dispatch(Turn(None, None, delegation_depth))
        dispatched = False

        def dispatch_once(turn: Turn) -> Awaitable[tuple[AdapterReply, Decision]]:
            nonlocal dispatched
            dispatched = True
            return dispatch(turn)

        try:
            async with self._lease(conversation_id, owner, no_wait=request.options.no_wait):
                return await self._transaction(
                    conversation_id, owner, request, delegation_depth, dispatch_once
                )
        except NegotiatorError as error:
            if not dispatched and refused is not None:
                refused(error)
            raise

    async def _transaction(
        self,
        conversation_id: str,
        owner: str,
        request: CallRequest,
        delegation_depth: int,
        dispatch: Dispatch,
    ) -> tuple[AdapterReply, Decision]:
        restart = request.options.new_conversation
        stored = await self._load(conversation_id, owner, tolerate_corrupt=restart)
        previous = None if restart else stored
        # Judged again: the adapter may have been re-registered while this call waited.
        current = self._preview(request)
        if previous is not None:
            check_binding(previous, current.adapter, current.declaration_version)
        turn = start_turn(conversation_id, stored, restart=restart, incoming_depth=delegation_depth)
        reply, decision = await dispatch(turn)
        if previous is not None and decision.declaration_version != previous.declaration_version:
            # Unreachable while nothing awaits between check_binding and the broker's
            # judgement; kept so that a future await there cannot commit state
            # under a declaration the conversation was not pinned to.
            raise DeclarationChanged(
                conversation_id, decision.adapter, previous.declaration_version, decision.declaration_version
            )
        record = next_record(previous, turn, decision, reply, self._clock())
        try:
            text = record_to_text(record)
        except (TypeError, ValueError) as exc:
            raise AdapterInternal(
                decision.adapter, f"returned conversation state that is not JSON: {exc}"
            ) from exc
        await to_the_end(asyncio.to_thread(self.store.save, conversation_id, text, owner))
        return reply, decision

    def _would_accept(self, request: CallRequest) -> bool:
        """The broker's verdict, so a call it refuses skips the lease."""
        try:
            return self._preview(request).accepted
        except NegotiatorError:
            return False

    async def _load(
        self, conversation_id: str, owner: str, *, tolerate_corrupt: bool
    ) -> ConversationRecord | None:
        try:
            return await asyncio.to_thread(self.store.load, conversation_id, owner)
        except ConversationStateCorrupt:
            if tolerate_corrupt:
                return None  # new_conversation overwrites it
            raise

    @contextlib.asynccontextmanager
    async def _lease(self, conversation_id: str, owner: str, *, no_wait: bool) -> AsyncIterator[None]:
        key = (owner, conversation_id)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        if no_wait and slot.users > 0:
            raise ConversationBusy(conversation_id)
        slot.users += 1
        try:
            async with slot.lock:
                fd = await self._file_lock(conversation_id, owner, no_wait=no_wait)
                try:
                    yield
                finally:
                    self.store.unlock(fd)
        finally:
            slot.users -= 1
            if slot.users == 0:
                del self._slots[key]

    async def _file_lock(self, conversation_id: str, owner: str, *, no_wait: bool) -> int:
        """The cross-process lease; polls while another negotiator holds it (cancellable)."""
        while True:
            fd = self.store.try_lock(conversation_id, owner)
            if fd is not None:
                return fd
            if no_wait:
                raise ConversationBusy(conversation_id)
            await asyncio.sleep(self._poll_seconds)
