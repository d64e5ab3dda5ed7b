"""The `serve` flags both sidecars share, and the ServerOptions they make.

    add_serve_arguments(parser)            # every flag below
    options = server_options_from_args(args)

Listeners and shutdown:
    --listen ADDR            repeatable; unix:PATH, unix:///PATH or HOST:PORT
    --health-listen ADDR     repeatable; serves grpc.health.v1 only (plaintext, no token)
    --grace-seconds S        (alias --grace) drain time on SIGTERM/SIGINT
    --socket-mode MODE       octal permissions of Unix socket files (default 0660)
Auth:
    --token-file PATH | --token-env NAME
                             bearer token(s) required on every method (health, reflection aside)
    --open-reads             with a token: the read-only methods need none
    --tls-cert PEM --tls-key PEM [--tls-client-ca PEM]
                             TLS on TCP listeners; with a client CA, mutual TLS
Limits:
    --max-message-bytes N    largest message received or sent (default 4 MiB)
    --max-concurrent-calls N beyond it RESOURCE_EXHAUSTED (health exempt)
    --default-timeout S      deadline for unary-response calls sent without one
Observability:
    --log-file PATH | --no-call-log
                             one JSON line per call (default: stderr)
    --metrics-listen HOST:PORT
                             Prometheus metrics over HTTP at /metrics
    --otel                   OpenTelemetry server spans, exported as OTEL_* say (agentsidecar[otel])

`--listen` and `--grace-seconds` have no default here: each service applies
its own (the seedstore reads $SEEDSTORE_LISTEN and $SEEDSTORE_GRACE_SECONDS).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentsidecar.sidecar_runtime.addresses import parse_address
from agentsidecar.sidecar_runtime.auth import EnvToken, TlsFiles, TokenFile, TokenSource
from agentsidecar.sidecar_runtime.server import DEFAULT_MAX_MESSAGE_BYTES, ServerOptions

DEFAULT_SOCKET_MODE = 0o660
DEFAULT_GRACE_SECONDS = 10.0


class ServeArgumentError(ValueError):
    """Flags that parse but cannot be served; the CLIs print it as a usage error."""


def _octal_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected octal permissions such as 0660, got {text!r}") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"permissions must be between 000 and 777, got {text!r}")
    return mode


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number of seconds, got {text!r}")
    return value


class _GraceSeconds(argparse.Action):
    """Stores `grace_seconds`, mirrored as `grace` (the negotiator's earlier flag name)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.grace = values


def add_serve_arguments(parser: argparse.ArgumentParser, *, listen_help: str = "") -> None:
    """Add the shared `serve` flags to `parser` (a `serve` subcommand parser)."""
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="ADDR",
        help="unix:PATH, unix:///PATH or HOST:PORT; repeat for several listeners" + listen_help,
    )
    parser.add_argument(
        "--health-listen",
        action="append",
        default=[],
        metavar="ADDR",
        help="an extra listener serving only grpc.health.v1 (plaintext, no token), e.g. for "
        "Kubernetes gRPC probes while the API stays on a Unix socket; repeatable",
    )
    parser.add_argument(
        "--grace-seconds",
        "--grace",
        dest="grace_seconds",
        action=_GraceSeconds,
        type=_seconds,
        metavar="SECONDS",
        help=f"time in-flight calls get to finish on SIGTERM/SIGINT (default {DEFAULT_GRACE_SECONDS:g})",
    )
    parser.set_defaults(grace_seconds=None, grace=None)
    parser.add_argument(
        "--socket-mode",
        type=_octal_mode,
        default=DEFAULT_SOCKET_MODE,
        metavar="MODE",
        help="octal permissions of Unix socket files; whoever can write the socket can call "
        "(default 0660: owner and group)",
    )

    auth = parser.add_argument_group(
        "auth",
        "Once a token is configured every method needs `authorization: Bearer <token>` (health and "
        "reflection aside): UNAUTHENTICATED without one, PERMISSION_DENIED with a wrong one. Tokens "
        "are accepted on Unix sockets, loopback TCP and TLS listeners only; start-up fails for a token "
        "on another plaintext TCP listener.",
    )
    tokens = auth.add_mutually_exclusive_group()
    tokens.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="file of accepted tokens, one per line (# comments allowed); re-read when it changes",
    )
    tokens.add_argument("--token-env", metavar="NAME", help="environment variable holding the accepted token")
    auth.add_argument(
        "--open-reads",
        action="store_true",
        help="with a token: leave the methods that only read (listed in protos/README.md) open to "
        "anyone who can reach the listener; methods that change state or run something always "
        "need the token",
    )
    auth.add_argument("--tls-cert", type=Path, metavar="PEM", help="server certificate chain (TCP listeners)")
    auth.add_argument("--tls-key", type=Path, metavar="PEM", help="server private key")
    auth.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="require a client certificate signed by this CA on TCP listeners (mutual TLS)",
    )

    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-message-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        metavar="N",
        help="largest message received or sent; larger ones fail with RESOURCE_EXHAUSTED "
        f"(default {DEFAULT_MAX_MESSAGE_BYTES}, 4 MiB)",
    )
    limits.add_argument(
        "--max-concurrent-calls",
        type=_positive_int,
        metavar="N",
        help="calls running at once (open streams count); one more fails at once with "
        "RESOURCE_EXHAUSTED, reason TOO_MANY_CALLS; health checks are exempt (default: unlimited)",
    )
    limits.add_argument(
        "--default-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="deadline given to unary-response calls that arrive without one; past it they fail "
        "with DEADLINE_EXCEEDED, reason DEFAULT_TIMEOUT_EXCEEDED; streams are exempt (default: none)",
    )

    observability = parser.add_argument_group("observability")
    call_log = observability.add_mutually_exclusive_group()
    call_log.add_argument(
        "--log-file",
        metavar="PATH",
        help="append the per-call JSON lines to PATH instead of stderr",
    )
    call_log.add_argument("--no-call-log", action="store_true", help="write no per-call JSON lines")
    observability.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics over plain HTTP at http://HOST:PORT/metrics (default: off)",
    )
    observability.add_argument(
        "--otel",
        action="store_true",
        help="a SERVER span per call with OpenTelemetry, exported as the OTEL_* variables say "
        "(OTLP over gRPC by default; needs pip install 'agentsidecar[otel]', start-up fails without it)",
    )


def server_options_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ServerOptions:
    """ServerOptions from the flags `add_serve_arguments` defines.

    `listen` and `grace_seconds` are taken as given (possibly empty / the
    default): the caller fills them from its own defaults.

    Raises:
        ServeArgumentError: an address, a token source or a TLS flag combination is unusable.
    """
    for flag, values in (("--listen", args.listen), ("--health-listen", args.health_listen)):
        for value in values:
            try:
                parse_address(value)
            except ValueError as exc:
                raise ServeArgumentError(f"{flag}: {exc}") from exc
    if args.metrics_listen is not None:
        try:
            if parse_address(args.metrics_listen).unix_path is not None:
                raise ValueError(f"expected HOST:PORT, got {args.metrics_listen!r}")
        except ValueError as exc:
            raise ServeArgumentError(f"--metrics-listen: {exc}") from exc
    tls = _tls_files(args)
    tokens = _token_source(args, env)
    call_log = None if args.no_call_log else (args.log_file or "-")
    return ServerOptions(
        listen=tuple(args.listen),
        health_listen=tuple(args.health_listen),
        grace_seconds=DEFAULT_GRACE_SECONDS if args.grace_seconds is None else args.grace_seconds,
        max_message_bytes=args.max_message_bytes,
        max_concurrent_calls=args.max_concurrent_calls,
        default_timeout=args.default_timeout,
        unix_socket_mode=args.socket_mode,
        tokens=tokens,
        open_reads=args.open_reads,
        tls=tls,
        call_log=call_log,
        metrics_listen=args.metrics_listen,
        otel=args.otel,
    )


def _tls_files(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise ServeArgumentError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ServeArgumentError("--tls-cert and --tls-key go together")
    return TlsFiles(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)


def _token_source(args: argparse.Namespace, env: Mapping[str, str] | None) -> TokenSource | None:
    try:
        if args.token_file is not None:
            return TokenFile(args.token_file)
        if args.token_env is not None:
            return EnvToken.read(args.token_env, env)
    except ValueError as exc:
        raise ServeArgumentError(str(exc)) from exc
    return None
