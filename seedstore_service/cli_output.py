"""The seedstore CLI's text: `cli_common.dumps`, with a `list` result's rows written from one
template; the warnings before an answer; the JSON error object of a local failure.

The CLI layer (it serialises for a terminal or a pipe); render.py builds the
objects printed, this module only writes them.
"""

from __future__ import annotations

from agentsidecar.seedstore_service.indexfile import list_row_text
from agentsidecar.sidecar_runtime import cli_common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

    from agentsidecar.seedstore_service.errors import SeedStoreError
    from agentsidecar.seedstore_service.model import ProblemLike

__all__ = ["dumps", "listing_text", "local_error_object", "print_warnings"]

_ROW_KEYS = ("id", "domain", "kind", "path", "provides", "verification_status", "risk", "revision")
_ROW_STRINGS = ("id", "domain", "kind", "path", "verification_status", "revision")
_SEEDS_LINE = '\n  "seeds": []'


class _NotARow(Exception):
    """A `seeds` element `_row_text` does not write (another shape): the whole output goes to `pretty`."""


def dumps(output: dict[str, Any], style: str) -> str:
    """`cli_common.dumps(output, style)`, byte for byte; a `list` result's rows written from a template.

    The generic pretty printer walks each of the 10,000 rows of a large `list` key by key;
    the rows all have one shape, so each is one f-string of escaped values.
    """
    seeds = output.get("seeds")
    if style != "pretty" or type(seeds) is not list or not seeds:
        return cli_common.dumps(output, style)
    try:
        return listing_text({**output, "seeds": []}, [_row_text(row) for row in seeds])
    except (_NotARow, ValueError):
        return cli_common.dumps(output, style)


def listing_text(output: dict[str, Any], rows: list[str]) -> str:
    """`output` (a `list` result whose `seeds` is empty) in the pretty style with `rows` (each
    written by `indexfile.list_row_text`) as its seeds."""
    if not rows:
        return cli_common.pretty(output)
    # Every other part of the output by the generic printer; its `"seeds": []` line (a raw
    # newline never occurs inside a JSON string, so the line is the key's) takes the rows.
    head, found, tail = cli_common.pretty(output).partition(_SEEDS_LINE)
    if not found:
        raise ValueError("the output holds no empty `seeds` line")
    return f'{head}\n  "seeds": [\n' + ",\n".join(rows) + f"\n  ]{tail}"


def _row_text(row: Any) -> str:
    """The row as `indexfile.list_row_text` writes it (the persisted index's listing uses the same
    template); `_NotARow` for any row of another shape."""
    if type(row) is not dict or tuple(row) != _ROW_KEYS:
        raise _NotARow
    for key in _ROW_STRINGS:
        if type(row[key]) is not str:
            raise _NotARow
    provides, risks = row["provides"], row["risk"]
    for values in (provides, risks):
        if type(values) is not list or any(type(value) is not str for value in values):
            raise _NotARow
    return list_row_text(
        row["id"],
        row["domain"],
        row["kind"],
        row["path"],
        provides,
        row["verification_status"],
        risks,
        row["revision"],
    )


def local_error_object(error: SeedStoreError, message: str) -> dict[str, Any]:
    """The JSON error a local failure prints: the status the service would send for it, from the
    same table (error_status.py, which imports no gRPC); an error with no row is the INTERNAL
    status.py sends."""
    from agentsidecar.seedstore_service.error_status import error_status

    status = error_status(error)
    if status is None:
        from agentsidecar.seedstore_service.status import to_rich_error

        return cli_common.status_error_object(to_rich_error(error), message)
    return cli_common.status_error_object(status, message)


def print_warnings(problems: Sequence[ProblemLike], stderr: TextIO) -> None:
    """An answer's problems, before it: `warning: <path>:<line>: <reason>`, one a line."""
    for problem in problems:
        print(f"warning: {problem.path}:{problem.line}: {problem.reason}", file=stderr)
