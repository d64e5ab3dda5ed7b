"""Channels to the sidecars: Unix socket or TCP, bearer token, TLS, retry policy.

    open_channel("unix:run/seedstore.sock")                         # plain, retrying idempotent calls
    open_channel("unix:///sockets/negotiator.sock", token="s3cret")  # local credentials + token
    open_channel("sidecar.internal:50062", tls=TlsConfig(ca="ca.pem"), token_file="/var/run/token")
    open_channel("127.0.0.1:50061", token="s3cret", aio=True)       # loopback: token as metadata

How a bearer token travels depends on the transport, because gRPC only sends
call credentials over a channel it considers secure:

- Unix socket: local channel credentials (UDS) composed with the token; the
  kernel keeps the bytes on this machine.
- TLS (any target): SSL credentials composed with the token.
- Plain TCP: the token is added as `authorization: Bearer ...` metadata by a
  client interceptor, and only to a loopback host (127.0.0.0/8, ::1,
  localhost); anything else is refused, since the token would cross a
  network in clear text.

`token_file` is re-read on every call (cheaply, by modification time), so a
rotated token (a Kubernetes projected token, for one) is picked up without
reopening the channel.

Retries follow gRFC A6 through a service config: UNAVAILABLE is retried (4
attempts, backoff 0.1 s doubling up to 1 s) on idempotent methods only.
Produce, Invoke and every write are never retried: an adapter call or a
write may have happened even when its answer was lost.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Generic, Literal, Self, TypeAlias, TypedDict, TypeVar, Unpack, overload

import grpc
import grpc.aio

from agentsidecar.sidecar_runtime.addresses import parse_address

# The services' full names, as the protos declare them (tests/clients/test_channel.py checks them
# against the generated descriptors): a client of one sidecar does not load the other's generated code.
SEEDSTORE_SERVICE: Final = "agentsidecar.seedstore.v1.SeedStoreService"
NEGOTIATOR_SERVICE: Final = "agentsidecar.negotiator.v1.NegotiatorService"

# Calls that change nothing, so repeating one after a lost answer is harmless.
IDEMPOTENT_METHODS: Final[Mapping[str, tuple[str, ...]]] = {
    SEEDSTORE_SERVICE: ("GetStore", "ListSeeds", "SearchSeeds", "InspectSeed", "ScanSeeds"),
    NEGOTIATOR_SERVICE: ("ListAdapters", "GetAdapter", "Negotiate"),
}

RETRY_POLICY: Final[Mapping[str, Any]] = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}

DEFAULT_TIMEOUT_SECONDS: Final = 30.0
AUTHORIZATION: Final = "authorization"

PemSource: TypeAlias = bytes | str | os.PathLike[str]
"""PEM data as bytes, or the path of a PEM file (str or Path)."""


class _ClientTimeout(enum.Enum):
    DEFAULT = "the client's timeout"


CLIENT_TIMEOUT: Final = _ClientTimeout.DEFAULT
"""Per-call `timeout` default: use the timeout the client was built with."""

Timeout: TypeAlias = float | _ClientTimeout | None
"""Seconds, None for no deadline, or CLIENT_TIMEOUT."""


def resolve_timeout(timeout: Timeout, client_timeout: float | None) -> float | None:
    return client_timeout if isinstance(timeout, _ClientTimeout) else timeout


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for a channel; every field is optional.

    `ca`: roots to trust (default: the system's). `cert` and `key`: a client
    certificate for mutual TLS (both or neither). `server_name`: the name to
    check the server's certificate against, when it differs from the target's
    host (e.g. dialling an IP or a Unix socket).
    """

    ca: PemSource | None = None
    cert: PemSource | None = None
    key: PemSource | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise ValueError("TlsConfig: cert and key go together (mutual TLS needs both)")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca), private_key=_pem(self.key), certificate_chain=_pem(self.cert)
        )


def _pem(source: PemSource | None) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    return Path(source).read_bytes()


def retry_service_config() -> str:
    """The service config JSON: retry UNAVAILABLE on the idempotent methods, nothing else."""
    names = [
        {"service": service, "method": method}
        for service, methods in IDEMPOTENT_METHODS.items()
        for method in methods
    ]
    return json.dumps({"methodConfig": [{"name": names, "retryPolicy": dict(RETRY_POLICY)}]})


def is_loopback_host(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (brackets allowed); never resolves names."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare.lower() == "localhost":
        return True
    import ipaddress  # only a plain TCP channel with a token asks

    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


class _TokenSource:
    """The current bearer token: a fixed string, or a file's content re-read when it changes."""

    def __init__(self, token: str | None, token_file: str | os.PathLike[str] | None) -> None:
        if token is not None and token_file is not None:
            raise ValueError("pass token or token_file, not both")
        self._path = Path(token_file) if token_file is not None else None
        self._mtime_ns = -1
        self._token = token or ""
        self.current()  # a missing or empty token fails now, not on the first call

    def current(self) -> str:
        if self._path is not None:
            mtime_ns = self._path.stat().st_mtime_ns
            if mtime_ns != self._mtime_ns:
                self._token = self._path.read_text(encoding="utf-8").strip()
                self._mtime_ns = mtime_ns
        if not self._token:
            where = f" in {self._path}" if self._path is not None else ""
            raise ValueError(f"empty bearer token{where}")
        return self._token

    def header(self) -> tuple[str, str]:
        return (AUTHORIZATION, f"Bearer {self.current()}")


class _TokenFilePlugin(grpc.AuthMetadataPlugin):
    def __init__(self, source: _TokenSource) -> None:
        self._source = source

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        try:
            header = self._source.header()
        except (OSError, ValueError) as error:
            callback((), error)
        else:
            callback((header,), None)


def _call_credentials(source: _TokenSource, token: str | None) -> grpc.CallCredentials:
    if token is not None:
        return grpc.access_token_call_credentials(token)
    return grpc.metadata_call_credentials(_TokenFilePlugin(source), name="token_file")


@dataclass(frozen=True, slots=True)
class _SyncCallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _SyncBearerInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    """Adds `authorization: Bearer ...` to every call of a plain loopback channel."""

    def __init__(self, source: _TokenSource) -> None:
        self._source = source

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _SyncCallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=(*(details.metadata or ()), self._source.header()),
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
            compression=details.compression,
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request)


MetadataSource = Callable[[], Sequence[tuple[str, str]]]


class _AioAddedMetadata:
    """Adds what `extra()` returns (asked per call; nothing when empty) to each call of an aio channel.

    One subclass per call kind: grpc.aio files an interceptor under the first kind it implements.
    """

    def __init__(self, extra: MetadataSource) -> None:
        self._extra = extra

    async def _intercept(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        extra = self._extra()
        if extra:
            details = client_call_details
            metadata = grpc.aio.Metadata(*(details.metadata or ()), *extra)
            client_call_details = grpc.aio.ClientCallDetails(
                details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
            )
        return await continuation(client_call_details, request)


class _AioAddedMetadataUnaryUnary(_AioAddedMetadata, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    intercept_unary_unary = _AioAddedMetadata._intercept


class _AioAddedMetadataUnaryStream(_AioAddedMetadata, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    intercept_unary_stream = _AioAddedMetadata._intercept


def metadata_interceptors(extra: MetadataSource) -> list[Any]:
    """aio interceptors adding `extra()` to every unary-request call (pass to `open_channel`)."""
    return [_AioAddedMetadataUnaryUnary(extra), _AioAddedMetadataUnaryStream(extra)]


@overload
def open_channel(
    target: str,
    *,
    token: str | None = ...,
    token_file: str | os.PathLike[str] | None = ...,
    tls: TlsConfig | None = ...,
    retry: bool = ...,
    aio: Literal[False] = ...,
    options: Sequence[tuple[str, Any]] = ...,
    interceptors: Sequence[Any] = ...,
) -> grpc.Channel: ...


@overload
def open_channel(
    target: str,
    *,
    token: str | None = ...,
    token_file: str | os.PathLike[str] | None = ...,
    tls: TlsConfig | None = ...,
    retry: bool = ...,
    aio: Literal[True],
    options: Sequence[tuple[str, Any]] = ...,
    interceptors: Sequence[Any] = ...,
) -> grpc.aio.Channel: ...


def open_channel(
    target: str,
    *,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    tls: TlsConfig | None = None,
    retry: bool = True,
    aio: bool = False,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[Any] = (),
) -> grpc.Channel | grpc.aio.Channel:
    """A channel to `target` (`unix:PATH`, `unix:///PATH` or `HOST:PORT`).

    `token`/`token_file`: a bearer token sent with every call (see the module
    docstring for how). `tls`: use TLS. `retry`: retry UNAVAILABLE on
    idempotent methods. `aio`: return a `grpc.aio.Channel` (create it inside
    the event loop that uses it). `options`: extra channel options.
    `interceptors`: client interceptors of the channel's kind (sync or aio),
    called after the bearer token's.

    Raises:
        ValueError: a malformed target, token and token_file both given, an
            empty token, or a token over plain TCP to a non-loopback host.
        OSError: a certificate or token file cannot be read.
    """
    address = parse_address(target)
    source = _TokenSource(token, token_file) if token is not None or token_file is not None else None
    channel_options: list[tuple[str, Any]] = list(options)
    if retry:
        channel_options += [("grpc.enable_retries", 1), ("grpc.service_config", retry_service_config())]
    if tls is not None and tls.server_name:
        channel_options.append(("grpc.ssl_target_name_override", tls.server_name))

    credentials: grpc.ChannelCredentials | None = None
    if tls is not None:
        credentials = tls.credentials()
    elif source is not None and address.is_unix:
        credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.UDS)
    elif source is not None:
        host = address.target.rpartition(":")[0]
        if not is_loopback_host(host):
            raise ValueError(
                f"refusing to send a bearer token in clear text to {target}: use TLS (tls=TlsConfig(...)), "
                "a Unix socket, or a loopback address (127.0.0.1, ::1, localhost)"
            )
    if credentials is not None and source is not None:
        credentials = grpc.composite_channel_credentials(credentials, _call_credentials(source, token))

    if aio:
        if credentials is not None:
            return grpc.aio.secure_channel(
                address.target, credentials, options=channel_options, interceptors=list(interceptors) or None
            )
        chain: list[Any] = []
        if source is not None:
            chain = metadata_interceptors(lambda: (source.header(),))
        chain += interceptors
        return grpc.aio.insecure_channel(address.target, options=channel_options, interceptors=chain or None)
    if credentials is not None:
        channel = grpc.secure_channel(address.target, credentials, options=channel_options)
        sync_chain = list(interceptors)
    else:
        channel = grpc.insecure_channel(address.target, options=channel_options)
        sync_chain = [_SyncBearerInterceptor(source)] if source is not None else []
        sync_chain += interceptors
    # One intercept_channel call: its first interceptor runs first, as in the aio chain.
    return grpc.intercept_channel(channel, *sync_chain) if sync_chain else channel


class ChannelSettings(TypedDict):
    """What `open_channel` takes besides the target (and `aio`), as a client passes it on."""

    token: str | None
    token_file: str | os.PathLike[str] | None
    tls: TlsConfig | None
    retry: bool


_Channel = TypeVar("_Channel", grpc.Channel, grpc.aio.Channel)
_Response = TypeVar("_Response")


class ChannelClient(Generic[_Channel]):
    """What every client shares, sync or asyncio: a channel (opened or given) and a default timeout.

    `timeout` applies to every unary call unless a method is given its own
    (None: no deadline); streams have no deadline by default. `token`,
    `token_file`, `tls` and `retry` are passed to `open_channel`; they are
    ignored when a channel is given. A channel passed in stays the caller's:
    closing the client closes only a channel it opened itself.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        channel: _Channel | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        tls: TlsConfig | None = None,
        retry: bool = True,
    ) -> None:
        if (target is None) == (channel is None):
            raise ValueError("pass either a target or a channel")
        self.timeout = timeout
        self.target = parse_address(target).target if target is not None else None
        self._owns_channel = channel is None
        if channel is None:
            assert target is not None
            channel = self._open(target, token=token, token_file=token_file, tls=tls, retry=retry)
        self.channel: _Channel = channel

    def _open(self, target: str, **settings: Unpack[ChannelSettings]) -> _Channel:
        raise NotImplementedError

    def _timeout(self, timeout: Timeout) -> float | None:
        return resolve_timeout(timeout, self.timeout)


class SyncClient(ChannelClient[grpc.Channel]):
    """What the synchronous clients share: `ChannelClient`, closing, and one way to make a unary call."""

    def _open(self, target: str, **settings: Unpack[ChannelSettings]) -> grpc.Channel:
        return open_channel(target, **settings)

    def close(self) -> None:
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(
        self,
        method: Callable[..., _Response],
        request: object,
        timeout: Timeout,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> _Response:
        try:
            return method(request, timeout=self._timeout(timeout), metadata=metadata)
        except grpc.RpcError as error:
            # The error tree is imported by the first failed call: a command that makes one
            # call which succeeds never builds it.
            from agentsidecar.clients.errors import from_rpc_error

            raise from_rpc_error(error) from None


__all__ = [
    "CLIENT_TIMEOUT",
    "DEFAULT_TIMEOUT_SECONDS",
    "IDEMPOTENT_METHODS",
    "NEGOTIATOR_SERVICE",
    "RETRY_POLICY",
    "SEEDSTORE_SERVICE",
    "ChannelClient",
    "ChannelSettings",
    "PemSource",
    "SyncClient",
    "Timeout",
    "TlsConfig",
    "is_loopback_host",
    "metadata_interceptors",
    "open_channel",
    "resolve_timeout",
    "retry_service_config",
]
