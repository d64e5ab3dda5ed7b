"""`negotiator`: run the negotiator, or talk to one.

    negotiator serve [--config FILE] [--state-dir DIR] [--seedstore ADDR] [--audit-log FILE]
                     [--allow-adapter-hosts HOST[,HOST]]... [--adapter-refresh-seconds SECONDS]
                     --listen ADDR [--listen ADDR]... [--grace SECONDS] [serve options]
    negotiator --version
    negotiator config-schema [--json-style pretty|compact]
    negotiator [--server ADDR] [--json-style pretty|compact] COMMAND ...
    negotiator [--server ADDR] adapters [SHORTNAME] [--watch]
    negotiator [--server ADDR] register TARGET [--shortname NAME]
    negotiator [--server ADDR] deregister SHORTNAME
    negotiator [--server ADDR] probe ADAPTER [--model M]
    negotiator [--server ADDR] negotiate (--adapter X | --agent Y) [--schema FILE_OR_JSON] PROMPT [options]
    negotiator [--server ADDR] produce (--adapter X | --agent Y) --schema FILE_OR_JSON PROMPT [options]
    negotiator [--server ADDR] invoke (--adapter X | --agent Y) PROMPT [--stream] [options]
    negotiator [--server ADDR] bootstrap CAPABILITY [--domain D] [--local-only] [--seed DOMAIN/ID]
                     [--approve GATE]... [--run [--prompt PROMPT]]

ADDR is `unix:PATH`, `unix:///PATH` or `HOST:PORT`. `--server` and
`--json-style` go before or after the client command (once); `--server`
defaults to $NEGOTIATOR_SERVER, else `unix:run/negotiator.sock`, the socket
`agentsidecar-pair` (scripts/run-pair.sh) serves. A server that is not a
negotiator is named as such ("... serves agentsidecar.seedstore.v1..., not the
negotiator"). `serve` without `--config` uses the embedded demo config;
its auth, limit and observability flags are shared with the seedstore
(`negotiator serve --help`; agentsidecar.sidecar_runtime.serve_args).
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

Output: JSON on stdout, pretty (2-space indent) unless `--json-style compact`;
`adapters --watch` prints one compact line per change.
    config-schema        the JSON Schema (draft 2020-12) of the `serve --config` file; save it and
                          point the editor at it (`# yaml-language-server: $schema=FILE` atop the config)
    adapters             {"adapters": [ADAPTER, ...]}
    adapters NAME        {"adapter": ADAPTER}
    adapters --watch     one {"change": "existing"|"registered"|"deregistered"|"updated",
                          "adapter": ADAPTER} per line
    register/deregister  {"adapter": ADAPTER}
    probe                {"adapter": ADAPTER, "evidence": [EVIDENCE]}: this probe's evidence; it sends
                          requests that cost tokens (an openai adapter's upstream only)
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
                                                   "string_formats", "hook_events", "effort_levels"}},
               "probe_evidence": [EVIDENCE]}
    EVIDENCE = {"model", "probe": "models"|"structured_output"|"tool_call"|"effort", "capability",
                "verdict": "passed"|"failed"|"inconclusive", "time", "request", "reply", "detail"}
    "model" of a decision: the entry of "models" that judged the call ("" for the adapter's own)
    VERDICT = {"capability", "set", "member", "request_field", "state", "allowed_unknown"}
    (set and member are null unless the requirement is a typed-set member)

Errors go to stderr, in the seedstore CLI's shape (agentsidecar.sidecar_runtime.cli_common):
`error: <message>`, then one compact JSON line
    {"error": {"code", "reason", "message", "metadata": {...},
               "field_violations": [{"field", "description"}],
               "precondition_violations": [{"type", "subject", "description"}]}}
and for a refusal (FAILED_PRECONDITION / UNSUPPORTED_CAPABILITY) also
    "adapter", "declaration_version",
    "gaps": [{"capability", "set", "member", "request_field", "state"}]
A usage error prints `error: <message>` and the subcommand's usage.

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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf import json_format, struct_pb2

from agentsidecar.common.v1 import common_pb2
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.sidecar_runtime import cli_common
from agentsidecar.sidecar_runtime.addresses import parse_address
from agentsidecar.sidecar_runtime.lifecycle import log_json
from agentsidecar.sidecar_runtime.serve_args import (
    ServeArgumentError,
    add_serve_arguments,
    server_options_from_args,
)

# The client (and with it the whole clients package) is imported by the client commands: `serve`
# and `config-schema` never load it.
if TYPE_CHECKING:
    from agentsidecar.clients.errors import SidecarError
    from agentsidecar.clients.negotiator import NegotiatorClient

SERVER_ENV = "NEGOTIATOR_SERVER"
# A file holding the bearer token to send (a negotiator run with --token-file asks for one).
TOKEN_FILE_ENV = "NEGOTIATOR_TOKEN_FILE"
DEFAULT_SERVER = "unix:run/negotiator.sock"
DEFAULT_CALL_TIMEOUT = 300.0
DEFAULT_ADMIN_TIMEOUT = 30.0
PROVIDER_MANAGED = "provider-managed"


EXIT_OK = cli_common.EXIT_OK
EXIT_FAILED = cli_common.EXIT_FAILED
EXIT_USAGE = cli_common.EXIT_USAGE
EXIT_REFUSED = cli_common.EXIT_REFUSED
EXIT_CODES_HELP = cli_common.exit_codes_help(refused=True, failed_note=" (including a config error at serve)")
SERVER_HELP = f"negotiator address (default ${SERVER_ENV}, else {DEFAULT_SERVER}, the run command's socket)"


class UsageError(Exception):
    """A command line that parsed but cannot be used; exits 2."""


class Parser(argparse.ArgumentParser):
    """argparse with the seedstore CLI's usage-error shape (`error: <message>`, then the usage).

    Long flags match by their full name only, as in the seedstore CLI (clap).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        usage = self.format_usage()
        self.exit(EXIT_USAGE, f"error: {message}\n\n{usage}\nFor more information, try '--help'.\n")


def _client_options_parser() -> Parser:
    """`--server` and `--json-style` after a client command (before it, the top-level parser's)."""
    parser = Parser(add_help=False)
    parser.add_argument("--server", dest="server_after", metavar="ADDR", help=SERVER_HELP)
    parser.add_argument(
        "--json-style",
        dest="json_style_after",
        choices=cli_common.JSON_STYLES,
        help=cli_common.JSON_STYLE_HELP,
    )
    return parser


# --- parsing ---------------------------------------------------------------------


def _call_options_parser() -> Parser:
    parser = Parser(add_help=False)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--adapter", help="an agent-framework adapter's shortname")
    target.add_argument("--agent", help="an agent-harness adapter's shortname")
    parser.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads stdin")
    parser.add_argument("--model", help="the model to run (needs model_override)")
    parser.add_argument("--effort", help="reasoning effort, one of the adapter's effort_levels")
    parser.add_argument("--profile", help="a profile the adapter declares")
    parser.add_argument("--persona", help="a persona (system prompt) for the call (needs persona)")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a setting whose value is JSON, e.g. 'style=\"terse\"' (repeatable)",
    )
    parser.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="NAME=TRANSPORT:COMMAND_OR_URL",
        help="an MCP server for the call; stdio takes a command line, sse/http a URL (repeatable)",
    )
    parser.add_argument(
        "--max-depth", metavar="N|provider-managed", help="how deep the call may delegate to other agents"
    )
    parser.add_argument(
        "--allow-tool", action="append", default=[], metavar="NAME", help="a tool it may use; repeatable"
    )
    parser.add_argument(
        "--deny-tool", action="append", default=[], metavar="NAME", help="a tool it may not use; repeatable"
    )
    parser.add_argument("--stream-events", action="store_true", help="ask for the adapter's events")
    parser.add_argument(
        "--allow-unknown",
        action="append",
        default=[],
        metavar="CAPABILITY",
        help="accept an UNKNOWN capability for this call (repeatable)",
    )
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="CAP",
        help="also require a capability (codemode) or a typed-set member (hook_events:pre_tool_use); "
        "repeatable",
    )
    parser.add_argument("--conversation", default="", metavar="ID", help="run as a turn of this conversation")
    parser.add_argument(
        "--no-wait", action="store_true", help="with --conversation: fail (ABORTED) if it is busy"
    )
    parser.add_argument(
        "--new-conversation",
        action="store_true",
        help="with --conversation: drop its state and pinned declaration first",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT,
        metavar="SECONDS",
        help=f"the call's deadline (default {DEFAULT_CALL_TIMEOUT:g})",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="negotiator",
        description="Run the capability negotiator, or query and call one.",
        epilog=f"{EXIT_CODES_HELP} Output shapes: the docstring of agentsidecar.negotiator_service.cli.",
    )
    cli_common.add_version_argument(parser)
    parser.add_argument("--server", metavar="ADDR", help=SERVER_HELP)
    parser.add_argument("--json-style", choices=cli_common.JSON_STYLES, help=cli_common.JSON_STYLE_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client = _client_options_parser()

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
    config_schema = commands.add_parser(
        "config-schema",
        help="print the JSON Schema of the `serve --config` file (for editors; reaches no server)",
    )
    config_schema.add_argument(
        "--json-style",
        choices=cli_common.JSON_STYLES,
        default=argparse.SUPPRESS,
        help=cli_common.JSON_STYLE_HELP,
    )

    admin_timeout_help = f"the call's deadline (default {DEFAULT_ADMIN_TIMEOUT:g})"
    adapters = commands.add_parser(
        "adapters", parents=[client], help="list adapters, get one, or watch changes"
    )
    adapters.add_argument("shortname", nargs="?", metavar="SHORTNAME", help="print only this adapter")
    adapters.add_argument("--watch", action="store_true", help="print every change as a JSON line")
    adapters.add_argument(
        "--timeout", type=float, default=DEFAULT_ADMIN_TIMEOUT, metavar="SECONDS", help=admin_timeout_help
    )

    register = commands.add_parser("register", parents=[client], help="register a remote adapter")
    register.add_argument("target", metavar="TARGET", help="the adapter's address (unix:PATH or HOST:PORT)")
    register.add_argument("--shortname", default="", help="refuse unless the adapter declares this name")
    register.add_argument(
        "--timeout", type=float, default=DEFAULT_ADMIN_TIMEOUT, metavar="SECONDS", help=admin_timeout_help
    )

    deregister = commands.add_parser(
        "deregister", parents=[client], help="remove a runtime-registered adapter"
    )
    deregister.add_argument("shortname", metavar="SHORTNAME", help="the adapter to remove")
    deregister.add_argument(
        "--timeout", type=float, default=DEFAULT_ADMIN_TIMEOUT, metavar="SECONDS", help=admin_timeout_help
    )

    probe = commands.add_parser(
        "probe", help="probe an openai adapter's upstream for one model (sends requests that cost tokens)"
    )
    probe.add_argument("shortname", metavar="ADAPTER", help="the adapter to probe")
    probe.add_argument(
        "--model", default="", help="the model to probe (default: the adapter's default model)"
    )
    probe.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT,
        metavar="SECONDS",
        help=f"deadline for the whole probe run (default {DEFAULT_CALL_TIMEOUT:g})",
    )

    call_options = _call_options_parser()
    negotiate = commands.add_parser(
        "negotiate", parents=[call_options, client], help="dry run: verdicts and gaps"
    )
    negotiate.add_argument("--schema", metavar="FILE_OR_JSON", help="judge a Produce call with this schema")
    produce = commands.add_parser("produce", parents=[call_options, client], help="structured output")
    produce.add_argument(
        "--schema",
        required=True,
        metavar="FILE_OR_JSON",
        help="the output's JSON Schema: JSON text, a file, or - for stdin",
    )
    invoke = commands.add_parser("invoke", parents=[call_options, client], help="plain text")
    invoke.add_argument(
        "--stream",
        action="store_true",
        help="InvokeStream: print each text delta (and event) as a JSON line as it arrives, then the result",
    )
    bootstrap = commands.add_parser(
        "bootstrap",
        parents=[client],
        help="seeds that may provide a capability no adapter declares; --run runs one",
    )
    bootstrap.add_argument("capability", metavar="CAPABILITY", help="the capability to find seeds for")
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
    bootstrap.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT,
        metavar="SECONDS",
        help=f"the call's deadline (default {DEFAULT_CALL_TIMEOUT:g})",
    )
    for subparser in commands.choices.values():
        subparser.epilog = subparser.epilog or EXIT_CODES_HELP
    return parser


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's own parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


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
        "probe_evidence": [probe_evidence_json(item) for item in adapter.probe_evidence],
    }


def probe_evidence_json(evidence: pb.ProbeEvidence) -> dict[str, Any]:
    unset = evidence.capability == common_pb2.CAPABILITY_UNSPECIFIED
    return {
        "model": evidence.model,
        "probe": evidence.probe,
        "capability": None
        if unset
        else _enum_name(common_pb2.Capability.Name(evidence.capability), "CAPABILITY_"),
        "verdict": _enum_name(pb.ProbeVerdict.Name(evidence.verdict), "PROBE_VERDICT_"),
        "time": evidence.time.ToJsonString(),
        "request": evidence.request,
        "reply": evidence.reply,
        "detail": evidence.detail,
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


def error_json(error: SidecarError, message: str | None = None) -> dict[str, Any]:
    """The JSON error object (cli_common's shape); a refusal adds its adapter and gaps."""
    from agentsidecar.clients.negotiator import refusal_gaps

    if is_refusal(error):
        return cli_common.status_error_object(
            error,
            message,
            adapter=error.metadata.get("adapter", ""),
            declaration_version=error.metadata.get("declarationVersion", ""),
            gaps=[dataclasses.asdict(gap) for gap in refusal_gaps(error)],
        )
    return cli_common.status_error_object(error, message)


def is_refusal(error: SidecarError) -> bool:
    from agentsidecar.clients.negotiator import UNSUPPORTED_CAPABILITY

    return error.code is grpc.StatusCode.FAILED_PRECONDITION and error.reason == UNSUPPORTED_CAPABILITY


# --- commands ----------------------------------------------------------------------


_json_style = cli_common.DEFAULT_JSON_STYLE


def _print(value: Any) -> None:
    """A command's result: one JSON document in the chosen --json-style."""
    print(cli_common.dumps(value, _json_style), flush=True)


def _print_line(value: Any) -> None:
    """One value of a stream: always one line."""
    print(cli_common.dumps_line(value), flush=True)


def resolve_client_options(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Settle `--server` and `--json-style`, given before or after the client command, once each."""
    for name in ("server", "json_style"):
        before, after = getattr(args, name, None), getattr(args, f"{name}_after", None)
        if before is not None and after is not None:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"argument {flag}: given both before and after the command; give it once")
        setattr(args, name, after if after is not None else before)
    args.server_defaulted = args.server is None and not env.get(SERVER_ENV)
    if args.server is None:
        args.server = env.get(SERVER_ENV) or DEFAULT_SERVER
    if args.json_style is None:
        args.json_style = cli_common.DEFAULT_JSON_STYLE


def _client(args: argparse.Namespace) -> NegotiatorClient:
    from agentsidecar.clients.negotiator import NegotiatorClient

    try:
        parse_address(args.server)
    except ValueError as exc:
        raise UsageError(f"--server: {exc}") from exc
    token_file = os.environ.get(TOKEN_FILE_ENV) or None
    try:
        return NegotiatorClient(args.server, timeout=args.timeout, token_file=token_file)
    except OSError as exc:
        raise UsageError(f"{TOKEN_FILE_ENV}: cannot read {exc.filename}: {exc.strerror}") from exc


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
                    _print_line(line)
            elif args.shortname:
                _print({"adapter": adapter_json(client.get_adapter(args.shortname))})
            else:
                _print({"adapters": [adapter_json(a) for a in client.list_adapters()]})
        elif command == "register":
            _print({"adapter": adapter_json(client.register_adapter(args.target, args.shortname))})
        elif command == "probe":
            probed = client.probe_adapter(args.shortname, args.model)
            _print(
                {
                    "adapter": adapter_json(probed.adapter),
                    "evidence": [probe_evidence_json(item) for item in probed.evidence],
                }
            )
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
                # A stream: one line per value, whatever --json-style says about documents.
                if kind == "delta":
                    _print_line({"delta": message.delta})
                elif kind == "event":
                    _print_line({"event": {"type": message.event.type, "text": message.event.text}})
                elif kind == "final":
                    _print_line(invoke_json(message.final))
        elif command == "invoke":
            _print(invoke_json(client.invoke(invoke_request(args))))
        elif command == "bootstrap":
            from agentsidecar.clients.negotiator import gate

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


def run_config_schema(args: argparse.Namespace) -> int:
    # Imported here: only this command and `serve` need the config models.
    from agentsidecar.negotiator_service.config import config_json_schema

    print(cli_common.dumps(config_json_schema(), args.json_style or cli_common.DEFAULT_JSON_STYLE))
    return EXIT_OK


def run_serve(args: argparse.Namespace) -> int:
    from agentsidecar.negotiator_service.errors import ConfigError
    from agentsidecar.negotiator_service.server import Settings, serve

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
    parser.error(message)  # prints the error line and the usage, and exits 2


def _error_message(error: SidecarError, target: str, defaulted: bool = False) -> str:
    """The `error:` line's text: the server's message, or what the CLI learnt about the target."""
    hint = f" (the default; pass --server ADDR or set {SERVER_ENV})" if defaulted else ""
    return cli_common.failed_call_text(
        error, target, cli_common.NEGOTIATOR_SERVICE, "negotiator", unreachable_as="the negotiator", hint=hint
    )


def main(argv: Sequence[str] | None = None) -> int:
    global _json_style
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(tokens)
    own = subcommand_parsers(parser).get(args.command, parser)
    if extra and args.command in tokens and tokens.index(extra[0]) < tokens.index(args.command):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        # argparse reports a subcommand's unknown flags with the top-level usage; name the subcommand's.
        own.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "serve":
            return run_serve(args)
        if args.command == "config-schema":
            return run_config_schema(args)
        resolve_client_options(args, os.environ)
        _json_style = args.json_style
        return run_client_command(args)
    except UsageError as exc:
        _fail_usage(own, str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return cli_common.reader_gone()
    except Exception as error:
        from agentsidecar.clients.errors import SidecarError

        if not isinstance(error, SidecarError):
            raise
        message = _error_message(error, args.server, getattr(args, "server_defaulted", False))
        cli_common.print_error(message, error_json(error, message), sys.stderr)
        return EXIT_REFUSED if is_refusal(error) else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
