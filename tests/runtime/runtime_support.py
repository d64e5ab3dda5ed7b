"""Helpers of the runtime tests: a probe service speaking raw bytes, call helpers, a throwaway PKI.

The probe service (`runtime.test.v1.Probe`) speaks raw bytes, so tests need
no generated code:

    Echo     unary; answers the request, or: b"big:N" N bytes, b"remaining"
             the handler's context.time_remaining(), b"fail" a rich NOT_FOUND
    Mutate   unary; the one method the probe does not declare a read
    Hold     unary; waits until the test calls `probe.release()`
    Sleep    unary; sleeps float(request) seconds
    Count    server stream (async generator); int(request) messages, 0.2 s apart
    Tick     server stream (context.write); int(request) messages, 0.2 s apart
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agentsidecar.sidecar_runtime.richstatus import RichError, abort_with, wire_message_size
from agentsidecar.sidecar_runtime.server import RunningServer

PROBE_SERVICE = "runtime.test.v1.Probe"
MUTATE = f"/{PROBE_SERVICE}/Mutate"
STREAM_INTERVAL_SECONDS = 0.2


def method(name: str) -> str:
    return f"/{PROBE_SERVICE}/{name}"


PROBE_READS = frozenset(method(name) for name in ("Echo", "Hold", "Sleep", "Count", "Tick"))


@dataclass
class Probe:
    """The probe service's state: what handlers saw, and the gate `Hold` waits on."""

    released: asyncio.Event = field(default_factory=asyncio.Event)
    holding: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    finished: list[str] = field(default_factory=list)

    def release(self) -> None:
        self.released.set()

    async def echo(self, request: bytes, context: Any) -> bytes:
        if request.startswith(b"big:"):
            return b"x" * int(request[4:])
        if request == b"remaining":
            return repr(context.time_remaining()).encode()
        if request == b"fail":
            await abort_with(
                context,
                RichError(
                    grpc.StatusCode.NOT_FOUND, "no such thing", reason="THING_MISSING", domain="probe.test"
                ),
            )
        return request

    async def mutate(self, request: bytes, context: Any) -> bytes:
        self.finished.append("Mutate")
        return b"done"

    async def wait_holding(self, count: int) -> None:
        async with asyncio.timeout(5), self._changed:
            await self._changed.wait_for(lambda: self.holding >= count)

    async def hold(self, request: bytes, context: Any) -> bytes:
        async with self._changed:
            self.holding += 1
            self._changed.notify_all()
        try:
            await self.released.wait()
        finally:
            self.holding -= 1
        return b"released"

    async def sleep(self, request: bytes, context: Any) -> bytes:
        await asyncio.sleep(float(request))
        self.finished.append("Sleep")
        return b"slept"

    async def count(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        for number in range(int(request)):
            if number:
                await asyncio.sleep(STREAM_INTERVAL_SECONDS)
            yield str(number).encode()

    async def tick(self, request: bytes, context: Any) -> None:
        for number in range(int(request)):
            if number:
                await asyncio.sleep(STREAM_INTERVAL_SECONDS)
            await context.write(str(number).encode())

    def register(self, server: grpc.aio.Server) -> None:
        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "Mutate": grpc.unary_unary_rpc_method_handler(self.mutate),
            "Hold": grpc.unary_unary_rpc_method_handler(self.hold),
            "Sleep": grpc.unary_unary_rpc_method_handler(self.sleep),
            "Count": grpc.unary_stream_rpc_method_handler(self.count),
            "Tick": grpc.unary_stream_rpc_method_handler(self.tick),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(PROBE_SERVICE, handlers),))


async def unary(channel: grpc.aio.Channel, name: str, request: bytes = b"", **kwargs: Any) -> bytes:
    response: bytes = await channel.unary_unary(method(name), None, None)(request, **kwargs)
    return response


async def stream(channel: grpc.aio.Channel, name: str, request: bytes, **kwargs: Any) -> list[bytes]:
    return [message async for message in channel.unary_stream(method(name), None, None)(request, **kwargs)]


# --- a throwaway PKI (as in tests/deploy/test_healthprobe.py) -------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path  # signed by another CA
    other_client_key: Path


SERVER_NAME = "sidecar.test"


def _openssl(*args: str | Path, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, f"openssl {' '.join(map(str, args))} failed: {result.stderr}"


def _make_ca(directory: Path, name: str) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-days", "1",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", f"{name}.pem", cwd=directory,
    )  # fmt: skip


def _issue(directory: Path, ca: str, name: str, subject: str, extensions: str) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=directory)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=directory)
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory,
    )  # fmt: skip


def make_pki(directory: Path) -> Pki:
    """A CA, a server cert for `sidecar.test`, a client cert, and a client cert from a stranger CA."""
    client_extensions = (
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    )
    _make_ca(directory, "ca")
    _make_ca(directory, "stranger")
    _issue(
        directory,
        "ca",
        "server",
        f"/CN={SERVER_NAME}",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{SERVER_NAME}\n",
    )
    _issue(directory, "ca", "client", "/CN=worker", client_extensions)
    _issue(directory, "stranger", "other", "/CN=intruder", client_extensions)
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_client_cert=directory / "other.pem",
        other_client_key=directory / "other.key",
    )


def tls_channel(target: str, pki: Pki, *, cert: Path | None, key: Path | None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=key.read_bytes() if key is not None else None,
        certificate_chain=cert.read_bytes() if cert is not None else None,
    )
    return grpc.aio.secure_channel(
        target, credentials, options=[("grpc.ssl_target_name_override", SERVER_NAME)]
    )


StartProbe = Callable[..., Awaitable[RunningServer]]


def trailer_bytes(error: Any) -> int:
    """grpc-message plus grpc-status-details-bin of a failed call, as they travelled."""
    details: bytes = b""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            details = value
    message: str = error.details() or ""
    return wire_message_size(message) + len(base64.b64encode(details).rstrip(b"="))
