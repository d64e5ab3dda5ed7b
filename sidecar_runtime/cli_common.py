"""What the `seedstore` and `negotiator` CLIs share: version, exit codes, JSON output, the error shape.

* `--version` prints `<prog> <version>` from the installed package's metadata.
* Exit codes: 0 success, 1 failure, 2 usage error, 3 refused (the negotiator
  only: the adapter's declaration does not meet the call).
* JSON: a command's one result is a document, printed with 2-space indentation
  (`--json-style pretty`, the default: SkillSpec's `to_string_pretty`, which the
  seedstore CLI matches byte for byte) or on one line (`--json-style compact`).
  A stream (one JSON value per event) is always one compact line per value,
  whatever the style, so line-reading consumers never see a value split.
* Errors: stderr gets `error: <message>`, then the error as one compact JSON
  line, `{"error": {"code", "reason", "message", "metadata", ...}}`: the first
  line for people, the last for programs. Usage errors (exit 2) print the
  `error:` line and the subcommand's usage.
* A CLI pointed at the other sidecar (or anything else) learns it from the
  UNIMPLEMENTED status the server sends for a method it does not have, asks the
  server's reflection service what it serves, and says so.

Nothing here imports grpc or argparse at module level: `--help`, `--version` and local commands stay fast.
"""

from __future__ import annotations

import sys

try:
    # The C escaper json.dumps(ensure_ascii=False) uses, without importing the json package (and
    # the regular expressions its decoder compiles): the seedstore's read commands print JSON from
    # a process that decodes none (quickread.py).
    from _json import encode_basestring as _escape
except ImportError:  # an interpreter without the C accelerator: json's own fallback
    from json.encoder import py_encode_basestring as _escape

encode_string = _escape
"""A str as a JSON string literal, non-ASCII kept as is."""

# typing is imported only by the type checker, for the same reason.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse  # imported by the functions that build parsers: local commands need none
    from collections.abc import Mapping, Sequence
    from typing import Any, Protocol, TextIO

    class _Violation(Protocol):
        @property
        def type(self) -> str: ...
        @property
        def subject(self) -> str: ...
        @property
        def description(self) -> str: ...

    class _Code(Protocol):
        @property
        def name(self) -> str: ...

    class StatusLike(Protocol):
        """A status's parts: `richstatus.RichError` (sent) and `DecodedError` / `SidecarError` (received)."""

        @property
        def code(self) -> _Code: ...
        @property
        def message(self) -> str: ...
        @property
        def reason(self) -> str: ...
        @property
        def metadata(self) -> Mapping[str, str]: ...
        @property
        def field_violations(self) -> Sequence[tuple[str, str]]: ...
        @property
        def precondition_violations(self) -> Sequence[_Violation]: ...


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3

JSON_STYLES = ("pretty", "compact")
DEFAULT_JSON_STYLE = "pretty"
JSON_STYLE_HELP = (
    "How a result is printed: pretty (2-space indent, the default) or compact (one line). "
    "Streams and the JSON error on stderr are always one line per value."
)
VERSION_HELP = "Print the version and exit."

PACKAGE = "agentsidecar"

SEEDSTORE_SERVICE = "agentsidecar.seedstore.v1.SeedStoreService"
NEGOTIATOR_SERVICE = "agentsidecar.negotiator.v1.NegotiatorService"


def version() -> str:
    """The installed package's version (its metadata, as pip installed it)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as metadata_version

    try:
        return metadata_version(PACKAGE)
    except PackageNotFoundError:
        return "unknown (not installed)"


def version_text(prog: str) -> str:
    return f"{prog} {version()}"


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """`--version`: prints `<prog> <version>` and exits 0."""
    import argparse

    class VersionAction(argparse.Action):
        """argparse's `version` action, reading the metadata only when `--version` is given."""

        def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
            super().__init__(
                option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help
            )

        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: object,
            option_string: str | None = None,
        ) -> None:
            sys.stdout.write(version_text(parser.prog) + "\n")
            parser.exit()

    parser.add_argument("--version", action=VersionAction, help=VERSION_HELP)


def exit_codes_help(*, refused: bool, success_note: str = "", failed_note: str = "") -> str:
    """The `Exit codes:` paragraph of a CLI's help."""
    parts = [f"0 success{success_note}", f"1 failure{failed_note}", "2 usage error"]
    if refused:
        parts.append("3 refused: the adapter's declaration does not meet the call")
    return "Exit codes: " + "; ".join(parts) + "."


def dumps(value: Any, style: str = DEFAULT_JSON_STYLE) -> str:
    """One JSON document in `style` (see the module docstring), non-ASCII kept as is."""
    if style == "compact":
        return dumps_line(value)
    return pretty(value)


class _NotPlain(Exception):
    """A value `pretty` leaves to json.dumps (a non-str key, a float, an unknown type)."""


def pretty(value: Any) -> str:
    """`json.dumps(value, indent=2, ensure_ascii=False)`, byte for byte, faster.

    json.dumps with an indent runs its pure-Python encoder; a `list` of 10,000 seeds spent
    most of its time there. This walks dicts and lists itself and leaves each string to
    the C escaper. Anything but str keys and str/int/bool/None/dict/list values goes to
    json.dumps whole.
    """
    try:
        return _pretty(value, "")
    except _NotPlain:
        import json

        return json.dumps(value, indent=2, ensure_ascii=False)


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return encode_string(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if kind is int:
        return int.__repr__(value)
    raise _NotPlain


def _pretty(value: Any, indent: str) -> str:
    kind = type(value)
    if kind is dict:
        if not value:
            return "{}"
        inner = indent + "  "
        parts = []
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            item_kind = type(item)
            if item_kind is str:
                parts.append(f"{inner}{encode_string(key)}: {encode_string(item)}")
            elif item_kind is dict or item_kind is list:
                parts.append(f"{inner}{encode_string(key)}: {_pretty(item, inner)}")
            else:
                parts.append(f"{inner}{encode_string(key)}: {_scalar(item)}")
        return "{\n" + ",\n".join(parts) + "\n" + indent + "}"
    if kind is list:
        if not value:
            return "[]"
        inner = indent + "  "
        if all(type(item) is str for item in value):
            items = [inner + encode_string(item) for item in value]
        else:
            items = [
                inner + (_pretty(item, inner) if type(item) in (dict, list) else _scalar(item))
                for item in value
            ]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return _scalar(value)


def dumps_line(value: Any) -> str:
    """One JSON value of a stream: always a single line."""
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def write_result(text: str, stdout: TextIO | None = None) -> int:
    """Write a command's result to `stdout` (default: sys.stdout) and flush; the exit code: 0, or
    1 when the reader has gone (`reader_gone`)."""
    stream = sys.stdout if stdout is None else stdout
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        return reader_gone(stream)
    return EXIT_OK


def reader_gone(stream: TextIO | None = None) -> int:
    """What a CLI does when writing its output failed because the reader went away (`| head`):
    no error to report, exit 1. The process's stdout is pointed at /dev/null, so the
    interpreter's own flush at exit writes nothing to the closed pipe and prints no traceback."""
    if stream is None or stream is sys.stdout:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    return EXIT_FAILED


def error_object(
    code: str,
    reason: str,
    message: str,
    metadata: Mapping[str, str] | None = None,
    field_violations: Sequence[tuple[str, str]] = (),
    precondition_violations: Sequence[tuple[str, str, str]] = (),
    **extra: Any,
) -> dict[str, Any]:
    """The JSON error object both CLIs print on stderr."""
    body: dict[str, Any] = {
        "code": code,
        "reason": reason,
        "message": message,
        "metadata": dict(sorted((metadata or {}).items())),  # a proto map has no order
        "field_violations": [{"field": f, "description": d} for f, d in field_violations],
        "precondition_violations": [
            {"type": t, "subject": s, "description": d} for t, s, d in precondition_violations
        ],
    }
    body.update(extra)
    return {"error": body}


def status_error_object(status: StatusLike, message: str | None = None, **extra: Any) -> dict[str, Any]:
    """The JSON error object of a status; `message` replaces the status's own."""
    return error_object(
        status.code.name,
        status.reason,
        status.message if message is None else message,
        status.metadata,
        status.field_violations,
        [(v.type, v.subject, v.description) for v in status.precondition_violations],
        **extra,
    )


def print_error(message: str, error: Mapping[str, Any], stderr: TextIO) -> None:
    """The one error shape: `error: <message>`, then the JSON error object on one line."""
    print(f"error: {message}", file=stderr)
    print(dumps_line(error), file=stderr, flush=True)


def served_services(target: str, timeout: float = 5.0) -> list[str] | None:
    """The services `target` lists through gRPC reflection, or None when it cannot say."""
    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from agentsidecar.clients.channel import open_channel

    try:
        channel = open_channel(target, retry=False)
    except (ValueError, OSError):
        return None
    with channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        try:
            for response in stub.ServerReflectionInfo(iter([request]), timeout=timeout):
                return sorted(service.name for service in response.list_services_response.service)
        except grpc.RpcError:
            return None
    return None


def failed_call_text(
    error: StatusLike, target: str, service: str, name: str, *, unreachable_as: str, hint: str = ""
) -> str:
    """What a CLI prints for a call to `target` that failed: the server's message, or what the
    CLI learnt about the target. Without ErrorInfo, UNAVAILABLE and DEADLINE_EXCEEDED mean no
    service answered (`unreachable_as` names the one expected, `hint` says where the address came
    from); UNIMPLEMENTED means the target may serve another service than `service` (`name`)."""
    import grpc  # here: the local commands that import this module make no call

    if not error.reason and error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"cannot reach {unreachable_as} at {target}{hint}: {error.message}"
    if not error.reason and error.code is grpc.StatusCode.UNIMPLEMENTED:
        wrong = wrong_service_message(target, service, name)
        if wrong is not None:
            return wrong
    return error.message


def wrong_service_message(target: str, expected_service: str, expected_name: str) -> str | None:
    """What to say when `target` answered UNIMPLEMENTED for a method of `expected_service`.

    None when the target does serve `expected_service` (the method itself is
    missing there, e.g. an older server): the server's own message says it then.
    """
    services = served_services(target)
    if services is None:
        return f"{target} does not serve {expected_service} (it has no such method and no reflection)"
    if expected_service in services:
        return None
    own = [name for name in services if not name.startswith("grpc.")]
    listed = ", ".join(own or services) or "no services"
    return f"{target} serves {listed}, not the {expected_name} ({expected_service})"
