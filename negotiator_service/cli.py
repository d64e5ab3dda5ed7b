"""`negotiator`: run the negotiator, or talk to one.

    negotiator serve [--config FILE] [--state-dir DIR] [--seedstore ADDR] [--audit-log FILE]
                     [--allow-adapter-hosts HOST[,HOST]]... [--adapter-refresh-seconds SECONDS]
                     --listen ADDR [--listen ADDR]... [--grace SECONDS] [serve options]
    negotiator [--server ADDR] adapters [SHORTNAME] [--watch]
    negotiator [--server ADDR] register TARGET [--shortname NAME]
    negotiator [--server ADDR] deregister SHORTNAME
    negotiator [--server ADDR] negotiate (--adapter X | --agent Y) [--schema FILE_OR_JSON] PROMPT [options]
    negotiator [--server ADDR] produce (--adapter X | --agent Y) --schema FILE_OR_JSON PROMPT [options]
    negotiator [--server ADDR] invoke (--adapter X | --agent Y) PROMPT [--stream] [options]
    negotiator [--server ADDR] bootstrap CAPABILITY [--domain D] [--local-only] [--seed DOMAIN/ID]
                     [--approve GATE]... [--run [--prompt PROMPT]]

ADDR is `unix:PATH`, `unix:///PATH` or `HOST:PORT`; `--server` defaults to
$NEGOTIATOR_SERVER. `serve` without `--config` uses the embedded demo config;
its auth, limit and observability flags are shared with the seedstore
(`negotiator serve --help`; sidecar_runtime.serve_args).
PROMPT `-` reads the prompt from stdin; `--schema` takes JSON text (starting
with `{`, or `true`/`false`), a file path, or `-` for stdin.

Call options (negotiate, produce, invoke); each one is a requirement the
adapter's declaration must meet:
    --model NAME  --effort LEVEL  --profile NAME  --persona NAME
    --setting KEY=JSON             repeatable; the value is JSON (`--setting 'style="terse"'`)
    --mcp NAME=TRANSPORT:TARGET    repeatable; stdio takes a command line, sse/http a URL
    --max-depth N|provider-managed
    --allow-tool NAME --deny-tool NAME   repeatable
    --stream-events
    --allow-unknown CAPABILITY     repeatable; accept an UNKNOWN capability for this call
    --require CAP                  repeatable; also require a capability (`codemode`) or a typed-set
                                   member (`hook_events:pre_tool_use`), judged as options.requires[i]
    --conversation ID              run as a turn of this conversation (needs stateful_history)
    --no-wait                      with --conversation: fail (ABORTED) instead of waiting for a busy one
    --new-conversation             with --conversation: drop its state and pinned declaration first
    --timeout SECONDS              the call's deadline (default 300; 30 for other commands)

Output: JSON on stdout.
    adapters             {"adapters": [ADAPTER, ...]}
    adapters NAME        {"adapter": ADAPTER}
    adapters --watch     one {"change": "existing"|"registered"|"deregistered"|"updated",
                          "adapter": ADAPTER} per line
    register/deregister  {"adapter": ADAPTER}
    negotiate            {"adapter", "declaration_version", "model", "accepted",
                          "verdicts": [VERDICT], "gaps": [VERDICT]}
    produce              {"adapter", "declaration_version", "model", "output": <the output, parsed>,
                          "verdicts": [VERDICT], "events": [{"type", "text"}]}
    invoke               {"adapter", "declaration_version", "model", "text", "verdicts": [VERDICT],
                          "events": [...]}
    invoke --stream      one {"delta": TEXT} or {"event": {"type", "text"}} per line as they arrive,
                         then the invoke object (its "events" empty: they were streamed)
    bootstrap            the BootstrapResponse in proto JSON with the proto's field names:
                         {"candidates": [...], "selected", "ask_policy", "run": {"seed", "argv",
                          "exit_code", "output", "evidence"}} ("ask_policy" and "run" only when set)
where
    ADAPTER = {"shortname", "kind": "agent-framework"|"agent-harness", "implementation",
               "source": "config"|"runtime", "target", "serving": "serving"|"not_serving",
               "serving_detail", "declaration_version", "scripted",
               "capabilities": {NAME: "supported"|"unsupported"|"unknown"},
               "mcp_transports", "accepted_settings", "string_formats", "hook_events", "effort_levels",
               "default_model", "models": {MODEL: {"capabilities", "mcp_transports", "accepted_settings",
                                                   "string_formats", "hook_events", "effort_levels"}}}
    "model" of a decision: the entry of "models" that judged the call ("" for the adapter's own)
    VERDICT = {"capability", "set", "member", "request_field", "state", "allowed_unknown"}
    (set and member are null unless the requirement is a typed-set member)

Errors go to stderr. A refusal (FAILED_PRECONDITION / UNSUPPORTED_CAPABILITY)
prints only
    {"error": {"code", "reason", "message", "adapter", "declaration_version",
               "gaps": [{"capability", "set", "member", "request_field", "state"}]}}
Any other failure prints `error: <message>` and then
    {"error": {"code", "reason", "message", "metadata": {...},
               "field_violations": [{"field", "description"}],
               "precondition_violations": [{"type", "subject", "description"}]}}

Exit codes: 0 success; 1 failure (including a config error at `serve`);
2 usage error; 3 refused: the adapter's declaration does not meet the call
(`negotiate` also exits 3 when its decision is not accepted).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import grpc
from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from google.protobuf import json_format, struct_pb2

from clients.errors import SidecarError
from clients.negotiator import UNSUPPORTED_CAPABILITY, NegotiatorClient, gate, refusal_gaps
from sidecar_runtime.addresses import parse_address
from sidecar_runtime.lifecycle import log_json
from sidecar_runtime.serve_args import ServeArgumentError, add_serve_arguments, server_options_from_args

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
SERVER_ENV = "NEGOTIATOR_SERVER"
DEFAULT_CALL_TIMEOUT = 300.0
DEFAULT_ADMIN_TIMEOUT = 30.0
PROVIDER_MANAGED = "provider-managed"


class UsageError(Exception):
    """A command line that parsed but cannot be used; exits 2."""


# --- parsing ---------------------------------------------------------------------


def _call_options_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--adapter", help="an agent-framework adapter's shortname")
    target.add_argument("--agent", help="an agent-harness adapter's shortname")
    parser.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads stdin")
    parser.add_argument("--model")
    parser.add_argument("--effort")
    parser.add_argument("--profile")
    parser.add_argument("--persona")
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=JSON")
    parser.add_argument("--mcp", action="append", default=[], metavar="NAME=TRANSPORT:COMMAND_OR_URL")
    parser.add_argument("--max-depth", metavar="N|provider-managed")
    parser.add_argument("--allow-tool", action="append", default=[], metavar="NAME")
    parser.add_argument("--deny-tool", action="append", default=[], metavar="NAME")
    parser.add_argument("--stream-events", action="store_true")
    parser.add_argument("--allow-unknown", action="append", default=[], metavar="CAPABILITY")
    parser.add_argument("--require", action="append", default=[], metavar="CAP")
    parser.add_argument("--conversation", default="", metavar="ID")
    parser.add_argument("--no-wait", action="store_true")
    parser.add_argument("--new-conversation", action="store_true")
    parser.add_argument("--timeout", type=float, default=DEFAULT_CALL_TIMEOUT, metavar="SECONDS")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="negotiator",
        description="Run the capability negotiator, or query and call one.",
        epilog="See the module docstring of negotiator_service.cli for output shapes and exit codes.",
    )
    parser.add_argument(
        "--server", default=os.environ.get(SERVER_ENV), help=f"negotiator address (default ${SERVER_ENV})"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the negotiator until SIGTERM/SIGINT")
    serve.add_argument("--config", type=Path, help="YAML config (default: the embedded demo config)")
    serve.add_argument(
        "--state-dir",
        type=Path,
        help="where conversations and runtime adapter registrations are kept "
        "(default $XDG_STATE_HOME/agentsidecar/conversations, "
        "else ~/.local/state/agentsidecar/conversations)",
    )
    serve.add_argument(
        "--seedstore",
        metavar="ADDR",
        help="the seedstore Bootstrap searches for capability seeds (default: none; Bootstrap is refused)",
    )
    serve.add_argument(
        "--seedstore-token-file",
        type=Path,
        metavar="PATH",
        help="a file holding the one bearer token to send to the seedstore (for a seedstore run "
        "with --token-file); re-read when it changes",
    )
    serve.add_argument(
        "--audit-log",
        type=Path,
        metavar="FILE",
        help="append every decision to FILE as a JSON line (default: none; WatchAudit streams them)",
    )
    serve.add_argument(
        "--allow-adapter-hosts",
        metavar="HOST[,HOST]",
        action="append",
        default=[],
        help="TCP hosts `register` (RegisterAdapter) may connect to besides Unix sockets and loopback "
        "addresses; repeatable, '*' allows any host (default: none; others are refused with "
        "PERMISSION_DENIED, ADAPTER_TARGET_NOT_ALLOWED, before any connection)",
    )
    serve.add_argument(
        "--adapter-refresh-seconds",
        type=_positive_seconds,
        metavar="SECONDS",
        help="how often each remote adapter's health and declaration are checked (default 30; "
        "also at once whenever its connection is re-established)",
    )
    add_serve_arguments(serve, listen_help=" (required)")

    adapters = commands.add_parser("adapters", help="list adapters, get one, or watch changes")
    adapters.add_argument("shortname", nargs="?", metavar="SHORTNAME")
    adapters.add_argument("--watch", action="store_true", help="print every change as a JSON line")
    adapters.add_argument("--timeout", type=float, default=DEFAULT_ADMIN_TIMEOUT, metavar="SECONDS")

    register = commands.add_parser("register", help="register a remote adapter")
    register.add_argument("target", metavar="TARGET")
    register.add_argument("--shortname", default="", help="refuse unless the adapter declares this name")
    register.add_argument("--timeout", type=float, default=DEFAULT_ADMIN_TIMEOUT, metavar="SECONDS")

    deregister = commands.add_parser("deregister", help="remove a runtime-registered adapter")
    deregister.add_argument("shortname", metavar="SHORTNAME")
    deregister.add_argument("--timeout", type=float, default=DEFAULT_ADMIN_TIMEOUT, metavar="SECONDS")

    call_options = _call_options_parser()
    negotiate = commands.add_parser("negotiate", parents=[call_options], help="dry run: verdicts and gaps")
    negotiate.add_argument("--schema", metavar="FILE_OR_JSON", help="judge a Produce call with this schema")
    produce = commands.add_parser("produce", parents=[call_options], help="structured output")
    produce.add_argument("--schema", required=True, metavar="FILE_OR_JSON")
    invoke = commands.add_parser("invoke", parents=[call_options], help="plain text")
    invoke.add_argument(
        "--stream",
        action="store_true",
        help="InvokeStream: print each text delta (and event) as a JSON line as it arrives, then the result",
    )
    bootstrap = commands.add_parser(
        "bootstrap", help="seeds that may provide a capability no adapter declares; --run runs one"
    )
    bootstrap.add_argument("capability", metavar="CAPABILITY")
    bootstrap.add_argument("--domain", default="", help="only seeds of this domain")
    bootstrap.add_argument("--local-only", action="store_true", help="leave out external services")
    bootstrap.add_argument(
        "--seed", default="", metavar="DOMAIN/ID", help="run this seed rather than the search's selection"
    )
    bootstrap.add_argument(
        "--approve",
        action="append",
        default=[],
        metavar="GATE",
        help="a gate the seed requires that you approve, e.g. provider_cost_approval (repeatable)",
    )
    bootstrap.add_argument("--run", action="store_true", help="run the chosen seed's command")
    bootstrap.add_argument("--prompt", default="", help="the run's stdin; - reads it from stdin")
    bootstrap.add_argument("--timeout", type=float, default=DEFAULT_CALL_TIMEOUT, metavar="SECONDS")
    return parser


def _prompt(value: str) -> str:
    return sys.stdin.read() if value == "-" else value


def _read_schema(value: str) -> str:
    if value == "-":
        return sys.stdin.read()
    stripped = value.strip()
    if stripped.startswith("{") or stripped in ("true", "false"):
        return value
    try:
        return Path(value).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"--schema: {value!r} is neither JSON text nor a readable file ({exc.strerror})"
        ) from exc


def _settings(items: Sequence[str]) -> struct_pb2.Struct | None:
    if not items:
        return None
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--setting {item!r}: expected KEY=JSON")
        try:
            values[key] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--setting {item!r}: the value is not JSON ({exc.msg}); quote strings: {key}='\"{text}\"'"
            ) from exc
    struct = struct_pb2.Struct()
    json_format.ParseDict(values, struct)
    return struct


def _mcp_server(item: str) -> pb.McpServer:
    name, sep, rest = item.partition("=")
    transport, sep2, where = rest.partition(":")
    if not sep or not name or not sep2 or not transport or not where:
        raise UsageError(
            f"--mcp {item!r}: expected NAME=TRANSPORT:COMMAND_OR_URL, e.g. fs=stdio:'npx server'"
        )
    if transport == "stdio":
        try:
            argv = shlex.split(where)
        except ValueError as exc:
            raise UsageError(f"--mcp {item!r}: cannot split the command: {exc}") from exc
        if not argv:
            raise UsageError(f"--mcp {item!r}: the stdio command is empty")
        return pb.McpServer(name=name, transport=transport, command=argv[0], args=argv[1:])
    # Unknown transports are passed on: the server names them in a field violation.
    return pb.McpServer(name=name, transport=transport, url=where)


def _max_depth(value: str | None) -> pb.MaxDepth | None:
    if value is None:
        return None
    if value == PROVIDER_MANAGED:
        return pb.MaxDepth(provider_managed=True)
    if not value.isdigit():
        raise UsageError(f"--max-depth {value!r}: expected a non-negative integer or {PROVIDER_MANAGED}")
    return pb.MaxDepth(depth=int(value))


def _capability(name: str) -> common_pb2.Capability.ValueType:
    wire = name.strip().upper().replace("-", "_")
    wire = wire if wire.startswith("CAPABILITY_") else f"CAPABILITY_{wire}"
    if wire not in common_pb2.Capability.keys() or wire == "CAPABILITY_UNSPECIFIED":  # noqa: SIM118
        choices = ", ".join(_enum_name(n, "CAPABILITY_") for n in common_pb2.Capability.keys()[1:])
        raise UsageError(f"--allow-unknown {name!r}: not a capability; expected one of {choices}")
    return common_pb2.Capability.Value(wire)


def call_options(args: argparse.Namespace) -> pb.CallOptions:
    options = pb.CallOptions()
    for name in ("model", "effort", "profile", "persona"):
        value = getattr(args, name)
        if value is not None:
            setattr(options, name, value)
    settings = _settings(args.setting)
    if settings is not None:
        options.settings.CopyFrom(settings)
    options.mcp_servers.extend(_mcp_server(item) for item in args.mcp)
    max_depth = _max_depth(args.max_depth)
    if max_depth is not None:
        options.max_depth.CopyFrom(max_depth)
    if args.allow_tool or args.deny_tool:
        options.tool_filter.CopyFrom(pb.ToolFilter(allow=args.allow_tool, deny=args.deny_tool))
    options.stream_events = args.stream_events
    options.allow_unknown.extend(_capability(name) for name in args.allow_unknown)
    # Checked by the negotiator, which names a bad entry options.requires[i].
    options.requires.extend(args.require)
    options.conversation_id = args.conversation
    options.no_wait = args.no_wait
    options.new_conversation = args.new_conversation
    return options


def _target(args: argparse.Namespace) -> dict[str, str]:
    return {"adapter": args.adapter} if args.adapter is not None else {"agent": args.agent}


def produce_request(args: argparse.Namespace) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        prompt=_prompt(args.prompt),
        output_schema=_read_schema(args.schema),
        options=call_options(args),
        **_target(args),
    )


def invoke_request(args: argparse.Namespace) -> pb.InvokeRequest:
    return pb.InvokeRequest(prompt=_prompt(args.prompt), options=call_options(args), **_target(args))


# --- JSON shapes -------------------------------------------------------------------


def _enum_name(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


def adapter_json(adapter: pb.Adapter) -> dict[str, Any]:
    declaration = adapter.declaration
    return {
        "shortname": declaration.shortname,
        "kind": _enum_name(common_pb2.AdapterKind.Name(declaration.kind), "ADAPTER_KIND_").replace("_", "-"),
        "implementation": adapter.implementation,
        "source": _enum_name(pb.AdapterSource.Name(adapter.source), "ADAPTER_SOURCE_"),
        "target": adapter.target,
        "serving": _enum_name(
            pb.AdapterServingStatus.Name(adapter.serving_status), "ADAPTER_SERVING_STATUS_"
        ),
        "serving_detail": adapter.serving_detail,
        "declaration_version": declaration.version,
        "scripted": declaration.scripted,
        **_declared_json(declaration),
        "default_model": declaration.default_model,
        "models": {entry.model: _declared_json(entry) for entry in declaration.models},
    }


def _declared_json(declaration: common_pb2.Declaration | common_pb2.ModelDeclaration) -> dict[str, Any]:
    """What a declaration, or one model's entry of it, states."""
    return {
        "capabilities": {
            _enum_name(common_pb2.Capability.Name(entry.capability), "CAPABILITY_"): _enum_name(
                common_pb2.CapabilityState.Name(entry.state), "CAPABILITY_STATE_"
            )
            for entry in declaration.capabilities
        },
        "mcp_transports": list(declaration.mcp_transports),
        "accepted_settings": list(declaration.accepted_settings),
        "string_formats": list(declaration.string_formats),
        "hook_events": list(declaration.hook_events),
        "effort_levels": list(declaration.effort_levels),
    }


def verdict_json(verdict: pb.Verdict) -> dict[str, Any]:
    requirement = verdict.requirement
    in_set = requirement.set != common_pb2.TYPED_SET_UNSPECIFIED
    return {
        "capability": _enum_name(common_pb2.Capability.Name(requirement.capability), "CAPABILITY_"),
        "set": _enum_name(common_pb2.TypedSet.Name(requirement.set), "TYPED_SET_") if in_set else None,
        "member": requirement.member if in_set else None,
        "request_field": requirement.request_field,
        "state": _enum_name(common_pb2.CapabilityState.Name(verdict.state), "CAPABILITY_STATE_"),
        "allowed_unknown": verdict.allowed_unknown,
    }


def decision_json(decision: pb.Decision) -> dict[str, Any]:
    return {
        "adapter": decision.adapter,
        "declaration_version": decision.declaration_version,
        "model": decision.model,
        "accepted": decision.accepted,
        "verdicts": [verdict_json(v) for v in decision.verdicts],
        "gaps": [verdict_json(v) for v in decision.gaps],
    }


def _events_json(events: Sequence[pb.StreamEvent]) -> list[dict[str, str]]:
    return [{"type": e.type, "text": e.text} for e in events]


def produce_json(response: pb.ProduceResponse) -> dict[str, Any]:
    return {
        "adapter": response.decision.adapter,
        "declaration_version": response.decision.declaration_version,
        "model": response.decision.model,
        "output": json.loads(response.output_json),
        "verdicts": [verdict_json(v) for v in response.decision.verdicts],
        "events": _events_json(response.events),
    }


def invoke_json(response: pb.InvokeResponse) -> dict[str, Any]:
    return {
        "adapter": response.decision.adapter,
        "declaration_version": response.decision.declaration_version,
        "model": response.decision.model,
        "text": response.text,
        "verdicts": [verdict_json(v) for v in response.decision.verdicts],
        "events": _events_json(response.events),
    }


def error_json(error: SidecarError) -> dict[str, Any]:
    if is_refusal(error):
        return {
            "error": {
                "code": error.code.name,
                "reason": error.reason,
                "message": error.message,
                "adapter": error.metadata.get("adapter", ""),
                "declaration_version": error.metadata.get("declarationVersion", ""),
                "gaps": [dataclasses.asdict(gap) for gap in refusal_gaps(error)],
            }
        }
    return {
        "error": {
            "code": error.code.name,
            "reason": error.reason,
            "message": error.message,
            "metadata": dict(error.metadata),
            "field_violations": [{"field": f, "description": d} for f, d in error.field_violations],
            "precondition_violations": [
                {"type": v.type, "subject": v.subject, "description": v.description}
                for v in error.precondition_violations
            ],
        }
    }


def is_refusal(error: SidecarError) -> bool:
    return error.code is grpc.StatusCode.FAILED_PRECONDITION and error.reason == UNSUPPORTED_CAPABILITY


# --- commands ----------------------------------------------------------------------


def _print(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False), flush=True)


def _client(args: argparse.Namespace) -> NegotiatorClient:
    if not args.server:
        raise UsageError(f"no server: pass --server ADDR or set {SERVER_ENV}")
    try:
        parse_address(args.server)
    except ValueError as exc:
        raise UsageError(f"--server: {exc}") from exc
    return NegotiatorClient(args.server, timeout=args.timeout)


def _watch(client: NegotiatorClient) -> Iterator[dict[str, Any]]:
    for change in client.watch_adapters():
        name = _enum_name(pb.AdapterChange.Name(change.change), "ADAPTER_CHANGE_")
        yield {"change": name, "adapter": adapter_json(change.adapter)}


def run_client_command(args: argparse.Namespace) -> int:
    with _client(args) as client:
        command = args.command
        if command == "adapters":
            if args.watch:
                for line in _watch(client):
                    _print(line)
            elif args.shortname:
                _print({"adapter": adapter_json(client.get_adapter(args.shortname))})
            else:
                _print({"adapters": [adapter_json(a) for a in client.list_adapters()]})
        elif command == "register":
            _print({"adapter": adapter_json(client.register_adapter(args.target, args.shortname))})
        elif command == "deregister":
            _print({"adapter": adapter_json(client.deregister_adapter(args.shortname))})
        elif command == "negotiate":
            call = produce_request(args) if args.schema is not None else invoke_request(args)
            decision = client.negotiate(call)
            _print(decision_json(decision))
            return EXIT_OK if decision.accepted else EXIT_REFUSED
        elif command == "produce":
            _print(produce_json(client.produce(produce_request(args))))
        elif command == "invoke" and args.stream:
            for message in client.invoke_stream(invoke_request(args)):
                kind = message.WhichOneof("kind")
                if kind == "delta":
                    _print({"delta": message.delta})
                elif kind == "event":
                    _print({"event": {"type": message.event.type, "text": message.event.text}})
                elif kind == "final":
                    _print(invoke_json(message.final))
        elif command == "invoke":
            _print(invoke_json(client.invoke(invoke_request(args))))
        elif command == "bootstrap":
            try:
                gates = [gate(name) for name in args.approve]
            except ValueError as exc:
                raise UsageError(f"--approve: {exc}") from exc
            response = client.bootstrap(
                capability=args.capability,
                domain=args.domain,
                local_only=args.local_only,
                seed=args.seed,
                approved_gates=gates,
                run=args.run,
                prompt=_prompt(args.prompt) if args.prompt else "",
            )
            _print(
                json_format.MessageToDict(
                    response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                )
            )
        else:  # pragma: no cover - argparse only accepts the commands above
            raise UsageError(f"unknown command {command!r}")
    return EXIT_OK


def run_serve(args: argparse.Namespace) -> int:
    from negotiator_service.errors import ConfigError
    from negotiator_service.server import Settings, serve

    if not args.listen:
        raise UsageError("the following arguments are required: --listen")
    if args.seedstore is not None:
        try:
            parse_address(args.seedstore)
        except ValueError as exc:
            raise UsageError(f"--seedstore: {exc}") from exc
    try:
        options = server_options_from_args(args)
    except ServeArgumentError as exc:
        raise UsageError(str(exc)) from exc
    # Decision records go to stderr through a batched writer (decisions_to_stderr);
    # the few other records (adapter registrations, unexpected errors) through logging.
    log_json("negotiator")
    # httpx logs each request it sends at INFO ("HTTP Request: POST ..."): the
    # call log already has a line per call, and each of httpx's lines was a
    # formatted, unbatched write on the openai adapter's path.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = Settings(
        listen=options.listen,
        config_path=args.config,
        grace_seconds=options.grace_seconds,
        server_options=options,
        state_dir=args.state_dir,
        seedstore_target=args.seedstore,
        seedstore_token_file=args.seedstore_token_file,
        audit_log=args.audit_log,
        decisions_to_stderr=True,
        adapter_hosts=_hosts(args.allow_adapter_hosts),
    )
    if args.adapter_refresh_seconds is not None:
        settings = dataclasses.replace(settings, adapter_refresh_seconds=args.adapter_refresh_seconds)
    try:
        asyncio.run(serve(settings))
    except ConfigError as exc:
        print(f"error: config: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return seconds


def _hosts(values: Sequence[str]) -> tuple[str, ...]:
    """The hosts of every --allow-adapter-hosts value (comma-separated)."""
    return tuple(host.strip() for value in values for host in value.split(",") if host.strip())


def _fail_usage(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.error(message)  # prints usage and exits 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return run_serve(args)
        return run_client_command(args)
    except UsageError as exc:
        _fail_usage(parser, str(exc))
    except SidecarError as error:
        if is_refusal(error):
            print(json.dumps(error_json(error), ensure_ascii=False), file=sys.stderr)
            return EXIT_REFUSED
        print(f"error: {error.message}", file=sys.stderr)
        print(json.dumps(error_json(error), ensure_ascii=False), file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
