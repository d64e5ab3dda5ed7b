"""`agentsidecar-health-probe`: a grpc_health_probe work-alike for compose and exec probes.

    agentsidecar-health-probe -addr unix:///sockets/seedstore.sock [-service NAME] [flags]

Same flags and exit codes as grpc-ecosystem's grpc_health_probe, which is not
installable from the registries this project uses, so the images carry this
one instead. It calls grpc.health.v1.Health/Check once and exits:

    0  the service is SERVING
    1  invalid arguments (including an option grpcio cannot honour)
    2  could not connect within -connect-timeout
    3  the Check RPC failed (unknown service = NOT_FOUND, no health service,
       -rpc-timeout exceeded)
    4  the service answered with a status other than SERVING

Flags take one or two dashes and `-flag value` or `-flag=value`, as Go's
flag package does; durations use Go syntax (`1s`, `500ms`, `2.5s`, `1m30s`).
Messages go to stderr in grpc_health_probe's wording.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsidecar.sidecar_runtime.addresses import parse_address

EXIT_SERVING = 0
EXIT_INVALID_ARGUMENTS = 1
EXIT_CONNECTION_FAILURE = 2
EXIT_RPC_FAILURE = 3
EXIT_UNHEALTHY = 4

PROG = "agentsidecar-health-probe"
DEFAULT_USER_AGENT = PROG
NANOS_PER_SECOND = 1_000_000_000


class UsageError(Exception):
    """A command line the probe cannot run; exits 1."""


class HelpRequested(Exception):
    """-h / -help: print the usage and exit 0, as Go's flag package does."""


# --- pure core: durations, flags, options -----------------------------------------

_UNIT_NANOS = {
    "ns": Decimal(1),
    "us": Decimal(1_000),
    "µs": Decimal(1_000),  # U+00B5 micro sign, Go accepts both spellings
    "μs": Decimal(1_000),  # U+03BC greek mu
    "ms": Decimal(1_000_000),
    "s": Decimal(NANOS_PER_SECOND),
    "m": Decimal(60 * NANOS_PER_SECOND),
    "h": Decimal(3600 * NANOS_PER_SECOND),
}
# Longer units first so "ms" is never read as "m" followed by garbage.
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    """Parse a Go `time.ParseDuration` string into nanoseconds.

    Raises:
        ValueError: not a Go duration (a bare number other than 0 needs a unit, as in Go).
    """
    body = text
    negative = body.startswith("-")
    if body and body[0] in "+-":
        body = body[1:]
    if body == "0":
        return 0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total = Decimal(0)
    position = 0
    while position < len(body):
        part = _DURATION_PART.match(body, position)
        if part is None:
            raise ValueError(f"invalid duration {text!r}")
        try:
            total += Decimal(part.group(1)) * _UNIT_NANOS[part.group(2)]
        except InvalidOperation as err:  # pragma: no cover - the regex only admits decimals
            raise ValueError(f"invalid duration {text!r}") from err
        position = part.end()
    nanos = int(total)
    return -nanos if negative else nanos


def _with_fraction(value: int, unit: int) -> str:
    whole, fraction = divmod(value, unit)
    if not fraction:
        return str(whole)
    digits = str(fraction).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def format_go_duration(nanos: int) -> str:
    """Format nanoseconds as Go's `time.Duration.String()` does (`1s`, `500ms`, `1m30s`)."""
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    magnitude = abs(nanos)
    if magnitude < 1_000:
        return f"{sign}{magnitude}ns"
    if magnitude < 1_000_000:
        return f"{sign}{_with_fraction(magnitude, 1_000)}µs"
    if magnitude < NANOS_PER_SECOND:
        return f"{sign}{_with_fraction(magnitude, 1_000_000)}ms"
    hours, rest = divmod(magnitude, 3600 * NANOS_PER_SECOND)
    minutes, rest = divmod(rest, 60 * NANOS_PER_SECOND)
    seconds = f"{_with_fraction(rest, NANOS_PER_SECOND)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return f"{sign}{seconds}"


@dataclass(frozen=True, slots=True)
class Flag:
    name: str
    kind: str  # "string" | "duration" | "bool"
    help: str
    default: str = ""


FLAGS: tuple[Flag, ...] = (
    Flag("addr", "string", "(required) unix:PATH, unix:///PATH or HOST:PORT to connect to"),
    Flag("service", "string", 'service name to check (default: "")'),
    Flag("connect-timeout", "duration", "timeout for establishing connection", "1s"),
    Flag("rpc-timeout", "duration", "timeout for health check rpc", "1s"),
    Flag("tls", "bool", "use TLS (default: false, INSECURE plaintext transport)"),
    Flag(
        "tls-no-verify",
        "bool",
        "NOT SUPPORTED: grpcio has no way to skip server certificate verification, so this flag "
        "exits 1; pass -tls-ca-cert with the CA that signed the server's certificate instead",
    ),
    Flag(
        "tls-ca-cert",
        "string",
        "(with -tls, optional) file containing trusted certificates for verifying server",
    ),
    Flag(
        "tls-client-cert",
        "string",
        "(with -tls, optional) client certificate for authenticating to the server "
        "(requires -tls-client-key)",
    ),
    Flag(
        "tls-client-key",
        "string",
        "(with -tls) client private key for authenticating to the server (requires -tls-client-cert)",
    ),
    Flag(
        "tls-server-name", "string", "(with -tls) override the hostname used to verify the server certificate"
    ),
    Flag("user-agent", "string", "user-agent header value of health check requests", DEFAULT_USER_AGENT),
    Flag("v", "bool", "verbose logs"),
)
_FLAGS_BY_NAME = {flag.name: flag for flag in FLAGS}
_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def usage() -> str:
    """The help text, laid out like Go's `flag.PrintDefaults`."""
    lines = [f"Usage of {PROG}:"]
    for flag in FLAGS:
        kind = "" if flag.kind == "bool" else f" {flag.kind}"
        default = f" (default {flag.default})" if flag.default and flag.kind == "duration" else ""
        if flag.kind == "string" and flag.default:
            default = f' (default "{flag.default}")'
        lines.append(f"  -{flag.name}{kind}")
        lines.append(f"    \t{flag.help}{default}")
    lines.append("Flags take one or two dashes: -addr=X, -addr X, --addr X.")
    lines.append(
        "Exit codes: 0 SERVING, 1 invalid arguments, 2 connection failure, 3 RPC failure, 4 not SERVING."
    )
    return "\n".join(lines)


def parse_flags(argv: Sequence[str]) -> dict[str, str | bool]:
    """Read Go-style flags into {name: value}; later repeats win, as in Go.

    Raises:
        HelpRequested: -h, -help (one or two dashes).
        UsageError: unknown flag, missing value, stray argument, bad boolean.
    """
    values: dict[str, str | bool] = {}
    arguments = list(argv)
    index = 0
    while index < len(arguments):
        token = arguments[index]
        index += 1
        if token == "--":
            if index < len(arguments):
                raise UsageError(f"unexpected argument {arguments[index]!r}")
            break
        if not token.startswith("-") or token == "-":
            raise UsageError(f"unexpected argument {token!r}")
        name = token[2:] if token.startswith("--") else token[1:]
        if not name or name.startswith(("-", "=")):
            raise UsageError(f"bad flag syntax: {token}")
        name, has_value, inline_value = name.partition("=")
        if name in ("h", "help"):
            raise HelpRequested
        flag = _FLAGS_BY_NAME.get(name)
        if flag is None:
            raise UsageError(f"flag provided but not defined: -{name}")
        if flag.kind == "bool":
            if not has_value or inline_value in _GO_TRUE:
                values[name] = True
            elif inline_value in _GO_FALSE:
                values[name] = False
            else:
                raise UsageError(f'invalid boolean value "{inline_value}" for -{name}')
            continue
        if not has_value:
            if index >= len(arguments):
                raise UsageError(f"flag needs an argument: -{name}")
            inline_value = arguments[index]
            index += 1
        values[name] = inline_value
    return values


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    addr: str
    target: str  # what grpc dials
    service: str = ""
    connect_timeout_nanos: int = NANOS_PER_SECOND
    rpc_timeout_nanos: int = NANOS_PER_SECOND
    tls: bool = False
    tls_ca_cert: str = ""
    tls_client_cert: str = ""
    tls_client_key: str = ""
    tls_server_name: str = ""
    user_agent: str = DEFAULT_USER_AGENT
    verbose: bool = False

    @property
    def connect_timeout_seconds(self) -> float:
        return self.connect_timeout_nanos / NANOS_PER_SECOND

    @property
    def rpc_timeout_seconds(self) -> float:
        return self.rpc_timeout_nanos / NANOS_PER_SECOND


def _duration_flag(values: dict[str, str | bool], name: str) -> int:
    raw = str(values.get(name, _FLAGS_BY_NAME[name].default))
    try:
        return parse_go_duration(raw)
    except ValueError as err:
        raise UsageError(f'invalid value "{raw}" for flag -{name}: parse error') from err


def build_options(argv: Sequence[str]) -> ProbeOptions:
    """Parse and check a command line the way grpc_health_probe does.

    Raises:
        HelpRequested: the caller asked for the usage.
        UsageError: anything grpc_health_probe rejects with exit 1, plus -tls-no-verify.
    """
    values = parse_flags(argv)

    def text(name: str) -> str:
        return str(values.get(name, _FLAGS_BY_NAME[name].default))

    def flag_set(name: str) -> bool:
        return values.get(name) is True

    addr = text("addr")
    if not addr:
        raise UsageError("-addr not specified")
    try:
        target = parse_address(addr).target
    except ValueError as err:
        raise UsageError(f"-addr: {err}") from err
    connect_timeout = _duration_flag(values, "connect-timeout")
    rpc_timeout = _duration_flag(values, "rpc-timeout")
    if connect_timeout <= 0:
        raise UsageError(
            f"-connect-timeout must be greater than zero (specified: {format_go_duration(connect_timeout)})"
        )
    if rpc_timeout <= 0:
        raise UsageError(
            f"-rpc-timeout must be greater than zero (specified: {format_go_duration(rpc_timeout)})"
        )
    tls = flag_set("tls")
    for name in ("tls-no-verify", "tls-ca-cert", "tls-client-cert", "tls-server-name"):
        if not tls and (flag_set(name) or (name != "tls-no-verify" and text(name))):
            raise UsageError(f"specified -{name} without specifying -tls")
    if text("tls-client-cert") and not text("tls-client-key"):
        raise UsageError("specified -tls-client-cert without specifying -tls-client-key")
    if text("tls-client-key") and not text("tls-client-cert"):
        raise UsageError("specified -tls-client-key without specifying -tls-client-cert")
    if flag_set("tls-no-verify"):
        if text("tls-ca-cert"):
            raise UsageError("cannot specify -tls-ca-cert with -tls-no-verify (CA cert would not be used)")
        if text("tls-server-name"):
            raise UsageError(
                "cannot specify -tls-server-name with -tls-no-verify (server name would not be used)"
            )
        raise UsageError(
            "-tls-no-verify is not supported: grpcio cannot skip server certificate verification; "
            "pass -tls-ca-cert with the CA that signed the server's certificate"
        )
    return ProbeOptions(
        addr=addr,
        target=target,
        service=text("service"),
        connect_timeout_nanos=connect_timeout,
        rpc_timeout_nanos=rpc_timeout,
        tls=tls,
        tls_ca_cert=text("tls-ca-cert"),
        tls_client_cert=text("tls-client-cert"),
        tls_client_key=text("tls-client-key"),
        tls_server_name=text("tls-server-name"),
        user_agent=text("user-agent"),
        verbose=flag_set("v"),
    )


def go_code_name(code: grpc.StatusCode) -> str:
    """`NOT_FOUND` -> `NotFound`, the spelling of Go's codes.Code.String()."""
    if code is grpc.StatusCode.OK:
        return "OK"
    return "".join(word.capitalize() for word in code.name.split("_"))


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # close to Go's %q for the strings a probe sees


# --- shell: credentials, connect, Check ---------------------------------------------


def _channel_credentials(options: ProbeOptions) -> grpc.ChannelCredentials:
    """TLS credentials from files; OSError when a file cannot be read."""
    root = Path(options.tls_ca_cert).read_bytes() if options.tls_ca_cert else None
    key = Path(options.tls_client_key).read_bytes() if options.tls_client_key else None
    chain = Path(options.tls_client_cert).read_bytes() if options.tls_client_cert else None
    return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)


def _channel(options: ProbeOptions, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    channel_options: list[tuple[str, str | int]] = [
        ("grpc.primary_user_agent", options.user_agent),
        # The default first reconnect backoff (1 s) equals the default connect
        # timeout, so a server that comes up a moment after the first attempt
        # would be missed; retry quickly within the probe's short life.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500),
    ]
    if credentials is None:
        return grpc.insecure_channel(options.target, options=channel_options)
    if options.tls_server_name:
        channel_options.append(("grpc.ssl_target_name_override", options.tls_server_name))
    return grpc.secure_channel(options.target, credentials, options=channel_options)


def run_probe(options: ProbeOptions, log: Callable[[str], None]) -> int:
    """Connect, call Check once, report like grpc_health_probe; return the exit code."""
    if options.verbose:
        log("parsed options:")
        log(
            f"> addr={options.addr} conn_timeout={format_go_duration(options.connect_timeout_nanos)} "
            f"rpc_timeout={format_go_duration(options.rpc_timeout_nanos)}"
        )
        log(f"> tls={str(options.tls).lower()}")
        if options.tls:
            log(f"  > ca-cert={options.tls_ca_cert}")
            log(f"  > client-cert={options.tls_client_cert}")
            log(f"  > client-key={options.tls_client_key}")
            log(f"  > server-name={options.tls_server_name}")
    credentials: grpc.ChannelCredentials | None = None
    if options.tls:
        try:
            credentials = _channel_credentials(options)
        except OSError as err:
            log(f"failed to initialize tls credentials. error={err}")
            return EXIT_INVALID_ARGUMENTS
    with _channel(options, credentials) as channel:
        if options.verbose:
            log("establishing connection")
        connect_started = time.monotonic()
        try:
            grpc.channel_ready_future(channel).result(timeout=options.connect_timeout_seconds)
        except grpc.FutureTimeoutError:
            log(
                f"timeout: failed to connect service {_quoted(options.addr)} "
                f"within {format_go_duration(options.connect_timeout_nanos)}"
            )
            return EXIT_CONNECTION_FAILURE
        except KeyboardInterrupt:
            log("cancellation received")
            log(f"error: failed to connect service at {_quoted(options.addr)}: context canceled")
            return EXIT_CONNECTION_FAILURE
        connect_nanos = int((time.monotonic() - connect_started) * NANOS_PER_SECOND)
        if options.verbose:
            log(f"connection established (took {format_go_duration(connect_nanos)})")

        rpc_started = time.monotonic()
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=options.service), timeout=options.rpc_timeout_seconds
            )
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = (err.details() if isinstance(err, grpc.Call) else str(err)) or ""
            if code is grpc.StatusCode.UNIMPLEMENTED:
                log("error: this server does not implement the grpc health protocol (grpc.health.v1.Health)")
            elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
                rpc_timeout = format_go_duration(options.rpc_timeout_nanos)
                log(f"timeout: health rpc did not complete within {rpc_timeout}")
            else:
                log(f"error: health rpc failed: rpc error: code = {go_code_name(code)} desc = {details}")
            return EXIT_RPC_FAILURE
        except KeyboardInterrupt:
            log("cancellation received")
            log("error: health rpc failed: rpc error: code = Canceled desc = context canceled")
            return EXIT_RPC_FAILURE
        rpc_nanos = int((time.monotonic() - rpc_started) * NANOS_PER_SECOND)

    status_name = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        log(f"service unhealthy (responded with {_quoted(status_name)})")
        return EXIT_UNHEALTHY
    if options.verbose:
        log(f"time elapsed: connect={format_go_duration(connect_nanos)} rpc={format_go_duration(rpc_nanos)}")
    log(f"status: {status_name}")
    return EXIT_SERVING


def _log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the grpc_health_probe exit code."""
    arguments = sys.argv[1:] if argv is None else argv
    try:
        options = build_options(arguments)
    except HelpRequested:
        _log_to_stderr(usage())
        return EXIT_SERVING
    except UsageError as err:
        _log_to_stderr(f"error: {err}")
        _log_to_stderr(f"run `{PROG} -h` for the flags")
        return EXIT_INVALID_ARGUMENTS
    return run_probe(options, _log_to_stderr)


if __name__ == "__main__":
    raise SystemExit(main())
