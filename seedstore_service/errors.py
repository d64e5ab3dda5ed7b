"""The seedstore's error taxonomy. No grpc here: `status.py` maps it once.

    SeedStoreError                 abstract
    ├── CallerError                abstract: the request names something wrong or stale
    │   ├── InvalidArgument        bad flag value (priority, tie, missing provides)
    │   │   └── InvalidIdentifier  identifier rule broken; names the field
    │   ├── SeedNotFound           unknown seed id
    │   ├── AmbiguousSeed          id found in several files; pass --domain
    │   ├── RevisionMismatch       expected revision differs from the file's
    │   └── WatchBacklogExceeded   a watcher fell too far behind; list and watch again
    └── StoreError                 abstract: the store's files or directory stand in the way
        ├── SeedMalformed          the targeted seed's file cannot be parsed
        ├── OutsideStore           a write would land outside the store (a linked directory)
        └── StoreUnavailable       HOME/SKILLSPEC_HOME unset, I/O failure

Only the leaves (and InvalidArgument, which InvalidIdentifier refines) are
raised; constructing an abstract base raises TypeError.

Messages are SkillSpec's, so the CLI prints the same `error: ...` line
whether it ran locally or through the service.
"""

from __future__ import annotations

from agentsidecar.sidecar_runtime.errortree import TreeError

# How much of a value from a request or a seed file an error quotes: enough to
# recognise it, never a whole file (a symlinked `/etc/passwd`) or a whole request.
EXCERPT_CHARS = 64


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text` cut to `limit` characters (marked with `…`), non-printable characters escaped.

    What errors and problems quote of any value they did not choose themselves:
    line breaks, NULs and terminal escapes come out as `\\n`, `\\x00`, `\\x1b`, so
    a quoted value is always one short, inert line.
    """
    cut = text[:limit]
    shown = "".join(char if char.isprintable() else _escaped(char) for char in cut)
    return shown + "…" if len(text) > limit else shown


def _escaped(char: str) -> str:
    code = ord(char)
    if char == "\n":
        return "\\n"
    if char == "\t":
        return "\\t"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


class SeedStoreError(TreeError, abstract=True):
    """Base of every seedstore error (the rules of the tree: sidecar_runtime.errortree)."""

    reason = "SEEDSTORE_ERROR"


class CallerError(SeedStoreError, abstract=True):
    """The request names something invalid, unknown, ambiguous or stale; the caller changes it."""


class StoreError(SeedStoreError, abstract=True):
    """The store's files or directory stand in the way of the request."""


class InvalidArgument(CallerError):
    reason = "INVALID_ARGUMENT"

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class InvalidIdentifier(InvalidArgument):
    reason = "INVALID_IDENTIFIER"

    def __init__(self, value: str, field: str, why: str = "") -> None:
        # SkillSpec's wording, with the value quoted as an excerpt; `why` adds the rule broken
        # where SkillSpec has none (the length limit).
        suffix = f": {why}" if why else ""
        super().__init__(f'invalid identifier "{excerpt(value)}" in {field}{suffix}', field)
        self.value = value


class SeedNotFound(CallerError):
    reason = "SEED_NOT_FOUND"

    def __init__(self, seed_id: str) -> None:
        super().__init__(f'unknown capability seed "{seed_id}"')
        self.seed_id = seed_id


class AmbiguousSeed(CallerError):
    reason = "SEED_AMBIGUOUS"

    def __init__(self, seed_id: str, paths: list[str]) -> None:
        super().__init__(f'capability seed "{seed_id}" exists in multiple domains; pass --domain')
        self.seed_id = seed_id
        self.paths = paths


class SeedMalformed(StoreError):
    reason = "SEED_MALFORMED"

    def __init__(self, path: str, line: int, detail: str) -> None:
        super().__init__(f"failed to parse YAML from {path}: {detail}")
        self.path = path
        self.line = line
        self.detail = detail


class RevisionMismatch(CallerError):
    reason = "REVISION_MISMATCH"

    def __init__(self, seed_id: str, expected: str, actual: str) -> None:
        super().__init__(
            f'capability seed "{seed_id}" has revision {actual}, not the expected {expected}; '
            "read it again and retry"
        )
        self.seed_id = seed_id
        self.expected = expected
        self.actual = actual


class OutsideStore(StoreError):
    """A write whose directory resolves outside the store root; reads may follow links there, writes never."""

    reason = "OUTSIDE_STORE"

    def __init__(self, path: str, root: str) -> None:
        super().__init__(f"refusing to write {path}: its directory resolves outside the seed store {root}")
        self.path = path
        self.root = root


class WatchBacklogExceeded(CallerError):
    """A WatchSeeds stream whose reader fell behind by more than the per-watcher budget."""

    reason = "WATCH_BACKLOG_EXCEEDED"

    def __init__(self, backlog_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"this watcher fell {backlog_bytes} bytes of changes behind, more than the "
            f"{limit_bytes} bytes kept for it; list the seeds and watch again"
        )
        self.backlog_bytes = backlog_bytes
        self.limit_bytes = limit_bytes


class StoreUnavailable(StoreError):
    reason = "STORE_UNAVAILABLE"
