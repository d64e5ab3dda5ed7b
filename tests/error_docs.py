"""Reading protos/README.md's error tables: the (status code, reason) pairs each section documents.

A row counts when its second column names a canonical status code; every backticked
UPPER_CASE word of its third column is a reason. tests/negotiator/test_error_docs.py and
tests/seedstore/test_error_docs.py compare these with what each service's status table returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from agentsidecar.sidecar_runtime import auth, handlers, limits

README = Path(__file__).resolve().parents[1] / "protos" / "README.md"
_CODE = re.compile(r"\b([A-Z_]+)\b")
_REASON = re.compile(r"`([A-Z][A-Z0-9_]+)`")

# Headings that open each service's part of the README, in document order.
SECTIONS = {
    "runtime": "## Errors",
    "seedstore": "## Seedstore errors",
    "negotiator": "## Negotiator errors",
    "adapter": "## The adapter contract",
}
STATUS_CODE_NAMES = frozenset(
    {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)


def section(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    starts = {key: text.index(heading) for key, heading in SECTIONS.items()}
    begin = starts[name]
    later = [start for start in starts.values() if start > begin]
    return text[begin : min(later) if later else len(text)]


def rows(text: str) -> Iterator[tuple[frozenset[str], frozenset[str]]]:
    """(status codes, reasons) of every table row whose second column names a status code."""
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or set(cells[0]) <= {"-", " ", ":"}:
            continue
        codes = frozenset(code for code in _CODE.findall(cells[1]) if code in STATUS_CODE_NAMES)
        if not codes:
            continue
        reasons = frozenset(_REASON.findall(cells[2]))
        yield codes, reasons


def documented(name: str) -> set[tuple[str, str]]:
    return {(code, reason) for codes, reasons in rows(section(name)) for code in codes for reason in reasons}


def reasons_documented_anywhere() -> set[str]:
    return {reason for name in SECTIONS for _, reasons in rows(section(name)) for reason in reasons}


# What the runtime itself returns on every RPC of both services.
RUNTIME = {
    ("UNAUTHENTICATED", auth.TOKEN_MISSING),
    ("PERMISSION_DENIED", auth.TOKEN_INVALID),
    ("RESOURCE_EXHAUSTED", limits.TOO_MANY_CALLS),
    ("DEADLINE_EXCEEDED", limits.DEFAULT_TIMEOUT_EXCEEDED),
    ("INVALID_ARGUMENT", handlers.MALFORMED_REQUEST),
}
