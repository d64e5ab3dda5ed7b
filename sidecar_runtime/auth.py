"""Who may call: bearer tokens, TLS and mutual TLS on TCP listeners.

Tokens travel as `authorization: Bearer <token>` metadata. A token is a
secret, so it is only accepted on a transport that does not expose it:

* a Unix socket (served with local credentials, so clients may attach call
  credentials with `grpc.local_channel_credentials(LocalConnectionType.UDS)`);
* a loopback TCP listener (127.0.0.0/8, ::1, `localhost`; served with local
  TCP credentials): only processes on this host can reach it, as with a
  Unix socket, but any local user can, hence the token;
* a TLS listener (`--tls-cert`/`--tls-key`).

A token on any other plaintext TCP listener (0.0.0.0, a pod IP) is refused at
start-up: it would cross the network in clear.

With a token configured, every method needs it, except grpc.health.v1 and
server reflection (probes and tools that discover the API carry no secret).
A service names its read-only methods, which read state and run nothing;
`open_reads` (`--open-reads`) leaves those open to whoever can reach the
listener (socket permissions, mTLS). A method that decides per request
whether it executes something (the negotiator's Bootstrap with `run`) is a
read to this layer and asks `require_token` itself when it is about to
execute. Mutual TLS (`--tls-client-ca`) makes every TCP call present a
client certificate signed by that CA; it does not replace the token check.

Token files hold one token per line (blank lines and `#` comments ignored),
so a rotation can list the old and the new token; the file is re-read when it
changes (checked at most once a second), and a file that is momentarily
missing or empty during a swap keeps the previous tokens.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from agentsidecar.sidecar_runtime.addresses import Address
from agentsidecar.sidecar_runtime.handlers import Behavior, MethodInfo, call_metadata
from agentsidecar.sidecar_runtime.richstatus import RichError, abort_with

DOMAIN = "auth.agentsidecar"
TOKEN_MISSING = "TOKEN_MISSING"
TOKEN_INVALID = "TOKEN_INVALID"
AUTHORIZATION_KEY = "authorization"
BEARER = "bearer"
# RFC 6750 b64token characters: what can travel unquoted in the header.
_TOKEN_SYNTAX = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_RELOAD_CHECK_SECONDS = 1.0
# Served without a token whatever the options: health for probes, reflection for discovery.
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
_LOGGER = logging.getLogger("agentsidecar.sidecar_runtime.auth")


class AuthConfigError(ValueError):
    """Auth options that cannot work together, or a token source that cannot be read."""


class TokenSource(Protocol):
    def tokens(self) -> Sequence[bytes]: ...

    def describe(self) -> str: ...


def parse_tokens(text: str, origin: str) -> tuple[bytes, ...]:
    """Tokens of a token file or variable: one per line, `#` comments and blank lines skipped.

    Raises:
        AuthConfigError: no token, or a token with characters a bearer header cannot carry.
    """
    tokens: list[bytes] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not _TOKEN_SYNTAX.fullmatch(line):
            raise AuthConfigError(
                f"{origin} line {number}: a token may only use letters, digits and -._~+/ "
                "(with trailing =), as a bearer header requires"
            )
        tokens.append(line.encode("ascii"))
    if not tokens:
        raise AuthConfigError(f"{origin} holds no token")
    return tuple(tokens)


@dataclass(frozen=True, slots=True)
class EnvToken:
    """The token(s) in an environment variable, read once at start-up."""

    name: str
    values: tuple[bytes, ...]

    @classmethod
    def read(cls, name: str, env: Mapping[str, str] | None = None) -> EnvToken:
        value = (os.environ if env is None else env).get(name)
        if not value:
            raise AuthConfigError(f"--token-env {name}: the variable is not set or empty")
        return cls(name, parse_tokens(value, f"${name}"))

    def tokens(self) -> Sequence[bytes]:
        return self.values

    def describe(self) -> str:
        return f"${self.name}"


class TokenFile:
    """The tokens in a file, re-read when the file changes."""

    def __init__(self, path: Path, *, check_every: float = _RELOAD_CHECK_SECONDS) -> None:
        self.path = path
        self._check_every = check_every
        self._signature = self._stat()
        if self._signature is None:
            raise AuthConfigError(f"--token-file {path}: cannot read the file")
        self._tokens = self._load()
        self._next_check = time.monotonic() + check_every

    def describe(self) -> str:
        return str(self.path)

    def tokens(self) -> Sequence[bytes]:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self._check_every
            signature = self._stat()
            if signature is not None and signature != self._signature:
                try:
                    self._tokens = self._load()
                    self._signature = signature
                except AuthConfigError as exc:
                    # Mid-rotation (a secret volume swapping its symlink): keep serving.
                    _LOGGER.warning("keeping the previous tokens: %s", exc)
        return self._tokens

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            info = self.path.stat()
        except OSError:
            return None
        return (info.st_ino, info.st_size, info.st_mtime_ns)

    def _load(self) -> tuple[bytes, ...]:
        try:
            text = self.path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"--token-file {self.path}: cannot read the file ({exc})") from exc
        return parse_tokens(text, f"--token-file {self.path}")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of the server's TLS identity; `client_ca` turns on mutual TLS."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        def read(flag: str, path: Path) -> bytes:
            try:
                return path.read_bytes()
            except OSError as exc:
                raise AuthConfigError(f"{flag} {path}: {exc.strerror or exc}") from exc

        key, chain = read("--tls-key", self.key), read("--tls-cert", self.cert)
        client_ca = read("--tls-client-ca", self.client_ca) if self.client_ca is not None else None
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )


def is_loopback(address: Address) -> bool:
    if address.unix_path is not None:
        return False
    host = address.target.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def check_token_transport(addresses: Iterable[Address], *, tls: bool) -> None:
    """Refuse tokens on a plaintext TCP listener other hosts can reach.

    Raises:
        AuthConfigError: naming the first such listener.
    """
    if tls:
        return
    for address in addresses:
        if address.unix_path is None and not is_loopback(address):
            raise AuthConfigError(
                f"--listen {address.target}: bearer tokens would cross the network in clear; "
                "add --tls-cert and --tls-key, or listen on a Unix socket or a loopback address"
            )


def listener_credentials(
    address: Address, *, tls: grpc.ServerCredentials | None, tokens: bool
) -> grpc.ServerCredentials | None:
    """The credentials a listener is served with; None for plaintext.

    Local credentials also accept plaintext clients, so configuring tokens
    breaks no existing client; they exist so that clients may attach call
    credentials, which grpc only sends on a channel it considers secure.
    """
    if address.unix_path is not None:
        return grpc.local_server_credentials(grpc.LocalConnectionType.UDS) if tokens else None
    if tls is not None:
        return tls
    if tokens and is_loopback(address):
        return grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    return None


def bearer_values(metadata: Iterable[tuple[str, Any]] | None) -> list[bytes]:
    """The tokens of every `authorization: Bearer ...` entry (scheme case-insensitive)."""
    found: list[bytes] = []
    for key, value in metadata or ():
        if key != AUTHORIZATION_KEY:
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == BEARER and token.strip():
            found.append(token.strip().encode("latin-1"))
    return found


def token_matches(given: bytes, accepted: Sequence[bytes]) -> bool:
    matched = False
    for token in accepted:
        # Every comparison runs, each in constant time: timing tells nothing
        # about which token, or how much of one, matched.
        matched |= hmac.compare_digest(given, token)
    return matched


def missing_token(method: str, action: str = "") -> RichError:
    """`action` says what needs the token when it is not the whole method (`with run set`)."""
    what = f"{method} {action}".strip()
    return RichError(
        code=grpc.StatusCode.UNAUTHENTICATED,
        message=f"{what} needs a bearer token: send `authorization: Bearer <token>`",
        reason=TOKEN_MISSING,
        domain=DOMAIN,
        metadata={"method": method},
    )


def invalid_token(method: str) -> RichError:
    return RichError(
        code=grpc.StatusCode.PERMISSION_DENIED,
        message=f"the bearer token sent to {method} is not one this sidecar accepts",
        reason=TOKEN_INVALID,
        domain=DOMAIN,
        metadata={"method": method},
    )


def judge(
    method: str, metadata: Iterable[tuple[str, Any]] | None, accepted: Sequence[bytes], action: str = ""
) -> RichError | None:
    """None when the call carries an accepted token, else the error to end it with."""
    given = bearer_values(metadata)
    if not given:
        return missing_token(method, action)
    if any(token_matches(token, accepted) for token in given):
        return None
    return invalid_token(method)


@dataclass(frozen=True, slots=True)
class _Unchecked:
    """A call the layer let through without a token: its method and the tokens it would need."""

    method: str
    source: TokenSource


# Set for the duration of a call the token layer let through unchecked (an
# open read); grpc.aio runs each call in a task of its own, so the value is
# this call's. Unset: tokens are off, or the layer already checked the call.
_UNCHECKED: ContextVar[_Unchecked | None] = ContextVar("unchecked_call", default=None)


def token_refusal(context: Any, action: str = "") -> RichError | None:
    """For a servicer about to execute inside a call the layer left open: the error, if any.

    None when no token is configured, or when the call already passed the
    layer's check; else the same refusal the layer gives (`action` names
    what needs the token, such as "with `run` set").
    """
    unchecked = _UNCHECKED.get()
    if unchecked is None:
        return None
    return judge(unchecked.method, call_metadata(context), unchecked.source.tokens(), action)


async def require_token(context: Any, action: str = "") -> None:
    """End the call with the token layer's refusal unless `token_refusal` finds none."""
    error = token_refusal(context, action)
    if error is not None:
        await abort_with(context, error)


class TokenCheck:
    """The bearer token check on every method but `open_methods` and `OPEN_SERVICES`, as a layer.

    `open_methods` are full names (`/pkg.Service/Method`). The check runs
    when the call starts, before the servicer: a refused call never reaches
    it, and its request stream is never read.
    """

    def __init__(self, source: TokenSource, open_methods: Collection[str] = ()) -> None:
        self._source = source
        self._open = frozenset(open_methods)

    def wrap(self, method: MethodInfo, inner: Behavior) -> Behavior:
        if method.service in OPEN_SERVICES:
            return inner
        full_method, source = method.full_name, self._source
        if full_method in self._open:
            unchecked = _Unchecked(full_method, source)

            async def open_call(request: Any, context: Any) -> Any:
                _UNCHECKED.set(unchecked)
                return await inner(request, context)

            return open_call

        async def authorized(request: Any, context: Any) -> Any:
            error = judge(full_method, call_metadata(context), source.tokens())
            if error is not None:
                await abort_with(context, error)
            return await inner(request, context)

        return authorized

    def refusal(self, full_method: str, metadata: Iterable[tuple[str, Any]] | None) -> RichError | None:
        """For a synchronous behaviour, which no layer wraps: the error ending the call, if any."""
        service = full_method.lstrip("/").partition("/")[0]
        if service in OPEN_SERVICES or full_method in self._open:
            return None
        return judge(full_method, metadata, self._source.tokens())
