"""Errors that quote too much still reach clients whole: capped, within gRPC's metadata limits.

A service whose methods fail with oversized RichErrors, on a real server;
grpcio (a C-core client, with C-core's 8 KiB soft / 16 KiB hard metadata
limits) must get the error's own code and ErrorInfo every time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentsidecar.clients.errors import from_rpc_error
from agentsidecar.sidecar_runtime.richstatus import (
    MAX_MESSAGE_WIRE_BYTES,
    MAX_METADATA_VALUE_CHARS,
    MAX_TRAILER_BYTES,
    MAX_VIOLATION_FIELD_CHARS,
    TRUNCATED,
    VIOLATIONS_OMITTED,
    DecodedError,
    PreconditionViolation,
    RichError,
    abort_with,
    decode_error,
    wire_message_size,
)
from agentsidecar.sidecar_runtime.server import RunningServer, ServerOptions, start_server
from tests.runtime.runtime_support import trailer_bytes

SERVICE = "runtime.test.v1.Oversized"
DOMAIN = "oversized.test"
HUGE_ID = "x" * 100_000


def gaps(count: int, width: int = 40) -> tuple[PreconditionViolation, ...]:
    return tuple(
        PreconditionViolation(
            "UNSUPPORTED_CAPABILITY",
            f"accepted_settings:key_{number:04d}_".ljust(width, "k"),
            f"options.settings.key_{number:04d} needs it; the declaration says unsupported",
        )
        for number in range(count)
    )


ERRORS: dict[str, RichError] = {
    "Gaps": RichError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "the adapter cannot honour: " + ", ".join(v.subject for v in gaps(500)),
        reason="UNSUPPORTED_CAPABILITY",
        domain=DOMAIN,
        metadata={"adapter": "demo", "gaps": ",".join(v.subject for v in gaps(500))},
        precondition_violations=gaps(500),
    ),
    "HugeIdentifier": RichError(
        grpc.StatusCode.NOT_FOUND,
        f'unknown capability seed "{HUGE_ID}"',
        reason="SEED_NOT_FOUND",
        domain=DOMAIN,
        metadata={"seedId": HUGE_ID},
    ),
    "HugeFields": RichError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "bad fields",
        reason="INVALID_IDENTIFIER",
        domain=DOMAIN,
        metadata={"field": "id"},
        field_violations=tuple((f"ids[{n}]", f"{HUGE_ID[:5000]} breaks the rule") for n in range(300)),
    ),
    # Percent-encoding triples every byte of UTF-8 beyond ASCII in grpc-message.
    "WideMessage": RichError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "ünïcödé " * 20_000,
        reason="SEED_MALFORMED",
        domain=DOMAIN,
        metadata={f"key{n}": "é" * 10_000 for n in range(12)},
        precondition_violations=(PreconditionViolation("MALFORMED", "é" * 10_000, "ü" * 10_000),),
        retry_after_seconds=1.5,
    ),
}


def register(server: grpc.aio.Server) -> None:
    def failing(error: RichError) -> Callable[[bytes, Any], Any]:
        async def fail(request: bytes, context: Any) -> bytes:
            await abort_with(context, error)
            raise AssertionError("abort_with returned")

        return fail

    async def mismatched(request: bytes, context: Any) -> bytes:
        # Details for one code on a call ending with another, as when grpc replaces a status.
        status = ERRORS["HugeIdentifier"].to_status()
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "replaced", status.trailing_metadata)
        raise AssertionError("abort returned")

    handlers = {name: grpc.unary_unary_rpc_method_handler(failing(error)) for name, error in ERRORS.items()}
    handlers["Mismatched"] = grpc.unary_unary_rpc_method_handler(mismatched)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


@pytest.fixture
async def oversized(socket_dir: Path) -> AsyncIterator[RunningServer]:
    options = ServerOptions(listen=(f"unix:{socket_dir / 'oversized.sock'}",), grace_seconds=0.1)
    server = await start_server(register, (SERVICE,), options)
    yield server
    await server.stop()


def sync_call(target: str, name: str) -> tuple[DecodedError, int]:
    """The error as grpcio's synchronous (C-core) client decodes it, and its trailer size."""
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(f"/{SERVICE}/{name}", None, None)(b"", timeout=5)
    return decode_error(caught.value), trailer_bytes(caught.value)


@pytest.mark.parametrize("name", sorted(ERRORS))
async def test_oversized_errors_keep_their_code_and_error_info(oversized: RunningServer, name: str) -> None:
    sent = ERRORS[name]
    async with grpc.aio.insecure_channel(oversized.bound[0]) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(f"/{SERVICE}/{name}", None, None)(b"", timeout=5)
    aio_error = decode_error(caught.value)
    sync_error, size = await asyncio.to_thread(sync_call, oversized.bound[0], name)
    for error in (aio_error, sync_error):
        assert error.code == sent.code
        assert (error.reason, error.domain) == (sent.reason, sent.domain)
        assert wire_message_size(error.message) <= MAX_MESSAGE_WIRE_BYTES
        assert error.message[:10] == sent.message[:10]
        for key, value in sent.metadata.items():
            assert len(error.metadata[key]) <= MAX_METADATA_VALUE_CHARS
            assert value.startswith(error.metadata[key].partition("...(")[0])
        kept = len(error.field_violations) + len(error.precondition_violations)
        sent_count = len(sent.field_violations) + len(sent.precondition_violations)
        assert kept >= min(sent_count, 1)
        assert kept + int(error.metadata.get(VIOLATIONS_OMITTED, "0")) == sent_count
        for violation in error.precondition_violations:
            assert max(map(len, (violation.type, violation.subject, violation.description))) <= (
                MAX_VIOLATION_FIELD_CHARS
            )
        for field, description in error.field_violations:
            assert max(len(field), len(description)) <= MAX_VIOLATION_FIELD_CHARS
        assert error.retry_after_seconds == sent.retry_after_seconds
        assert "message" in error.metadata[TRUNCATED].split(",") or error.message == sent.message
    assert size <= MAX_TRAILER_BYTES
    client_error = from_rpc_error(caught.value)
    assert client_error.violations_omitted == int(aio_error.metadata.get(VIOLATIONS_OMITTED, "0"))
    assert set(client_error.truncated) >= {key for key in sent.metadata if len(sent.metadata[key]) > 256}


def test_what_fits_is_sent_unchanged() -> None:
    small = RichError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "the adapter cannot honour 3 requirements",
        reason="UNSUPPORTED_CAPABILITY",
        domain=DOMAIN,
        metadata={"adapter": "demo"},
        precondition_violations=gaps(3),
    )
    status = small.to_status()
    assert status.details == small.message
    details = status.trailing_metadata[0][1]
    assert VIOLATIONS_OMITTED.encode() not in details
    assert TRUNCATED.encode() not in details
    for violation in small.precondition_violations:
        assert violation.description.encode() in details


async def test_details_that_contradict_the_call_decode_as_the_call_alone(oversized: RunningServer) -> None:
    async with grpc.aio.insecure_channel(oversized.bound[0]) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(f"/{SERVICE}/Mismatched", None, None)(b"", timeout=5)
    assert decode_error(caught.value) == DecodedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "replaced")
